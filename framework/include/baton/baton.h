// The one header a user's node includes.
#pragma once

#include "baton/client.h"
#include "baton/config.h"
#include "baton/events.h"
#include "baton/handler.h"
#include "baton/job.h"
#include "baton/logging.h"
#include "baton/node.h"
#include "baton/saga.h"
