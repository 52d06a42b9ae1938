// Interval and cron schedules (see schedule.h). Time zones come from the system's tz database
// through Howard Hinnant's date/tz library.
#include "baton/detail/schedule.h"

#include <date/tz.h>

#include <array>
#include <bitset>
#include <charconv>
#include <vector>

#include "baton/config.h"

namespace baton::detail {
namespace {

class EverySchedule final : public Schedule {
 public:
  explicit EverySchedule(std::chrono::seconds interval) : interval_(interval) {}
  SysSeconds next_after(SysSeconds t) const override {
    const auto n = t.time_since_epoch().count() / interval_.count();
    return SysSeconds(std::chrono::seconds((n + 1) * interval_.count()));
  }
  std::string describe() const override {
    return "every " + std::to_string(interval_.count()) + "s";
  }

 private:
  std::chrono::seconds interval_;
};

struct Field {
  const char* name;
  int min;
  int max;
  const char* const* names;  // index 0 names `min`, or nullptr
  int name_count;
};

constexpr const char* kMonths[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                   "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr const char* kDays[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};
constexpr std::array<Field, 5> kFields{{{"minute", 0, 59, nullptr, 0},
                                        {"hour", 0, 23, nullptr, 0},
                                        {"day-of-month", 1, 31, nullptr, 0},
                                        {"month", 1, 12, kMonths, 12},
                                        {"day-of-week", 0, 7, kDays, 7}}};

[[noreturn]] void bad(std::string_view expr, std::size_t pos, const Field& f,
                      const std::string& what) {
  throw ConfigError("cron: '" + std::string(expr) + "': " + what + " in the " + f.name +
                    " field at position " + std::to_string(pos + 1) + " (accepted: " +
                    std::to_string(f.min) + "-" + std::to_string(f.max == 7 ? 6 : f.max) +
                    (f.names != nullptr ? ", names such as " + std::string(f.names[0]) : "") +
                    ", *, a-b, */n, lists)");
}

int value(std::string_view expr, std::size_t pos, std::string_view text, const Field& f) {
  for (int i = 0; i < f.name_count; ++i) {
    std::string lower(text);
    for (auto& c : lower)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == f.names[i]) return f.min + i;
  }
  int v = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
    bad(expr, pos, f, "'" + std::string(text) + "' is not a number");
  }
  if (v < f.min || v > f.max) bad(expr, pos, f, std::to_string(v) + " is out of range");
  return v;
}

template <std::size_t N>
bool parse_field(std::string_view expr, std::size_t start, std::string_view text, const Field& f,
                 std::bitset<N>& bits) {
  bool star = false;
  std::size_t item_start = 0;
  while (item_start <= text.size()) {
    auto comma = text.find(',', item_start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(item_start, comma - item_start);
    const std::size_t pos = start + item_start;
    if (item.empty()) bad(expr, pos, f, "an empty list item");
    int step = 1;
    const bool stepped = item.find('/') != std::string_view::npos;
    if (auto slash = item.find('/'); slash != std::string_view::npos) {
      const auto step_text = item.substr(slash + 1);
      auto [end, ec] = std::from_chars(step_text.data(), step_text.data() + step_text.size(), step);
      if (step_text.empty() || ec != std::errc{} || end != step_text.data() + step_text.size() ||
          step < 1) {
        bad(expr, pos + slash + 1, f,
            "step '" + std::string(step_text) + "' is not a positive number");
      }
      item = item.substr(0, slash);
    }
    int lo = f.min, hi = f.max == 7 ? 6 : f.max;
    if (item == "*") {
      star = star || step == 1;
    } else if (auto dash = item.find('-'); dash != std::string_view::npos) {
      lo = value(expr, pos, item.substr(0, dash), f);
      hi = value(expr, pos + dash + 1, item.substr(dash + 1), f);
      if (hi < lo) bad(expr, pos, f, "range " + std::string(item) + " runs backwards");
    } else {
      // "5/15" runs from 5 to the end of the range, every 15; "5" is just 5.
      lo = value(expr, pos, item, f);
      hi = stepped ? (f.max == 7 ? 6 : f.max) : lo;
    }
    const bool weekday = f.max == 7;  // only there does 7 mean Sunday (0)
    for (int v = lo; v <= hi; v += step) {
      bits.set(static_cast<std::size_t>(weekday && v == 7 ? 0 : v));
    }
    item_start = comma + 1;
  }
  return star;
}

class CronSchedule final : public Schedule {
 public:
  CronSchedule(std::string_view expression, std::string_view tz) : text_(expression) {
    std::string expr(expression);
    if (expr == "@yearly" || expr == "@annually") expr = "0 0 1 1 *";
    if (expr == "@monthly") expr = "0 0 1 * *";
    if (expr == "@weekly") expr = "0 0 * * 0";
    if (expr == "@daily" || expr == "@midnight") expr = "0 0 * * *";
    if (expr == "@hourly") expr = "0 * * * *";
    std::vector<std::pair<std::size_t, std::string_view>> parts;
    const std::string_view view(expr);
    std::size_t i = 0;
    while (i < view.size()) {
      while (i < view.size() && view[i] == ' ')
        ++i;
      if (i == view.size()) break;
      const auto start = i;
      while (i < view.size() && view[i] != ' ')
        ++i;
      parts.emplace_back(start, view.substr(start, i - start));
    }
    if (parts.size() != 5) {
      throw ConfigError("cron: '" + std::string(expression) + "' has " +
                        std::to_string(parts.size()) +
                        " fields; use 5 (minute hour day-of-month month day-of-week) or a macro "
                        "such as @daily");
    }
    const std::string_view shown = expression;
    parse_field(shown, parts[0].first, parts[0].second, kFields[0], minute_);
    parse_field(shown, parts[1].first, parts[1].second, kFields[1], hour_);
    dom_star_ = parse_field(shown, parts[2].first, parts[2].second, kFields[2], dom_);
    parse_field(shown, parts[3].first, parts[3].second, kFields[3], month_);
    dow_star_ = parse_field(shown, parts[4].first, parts[4].second, kFields[4], dow_);
    try {
      zone_ = date::locate_zone(std::string(tz));
    } catch (const std::exception&) {
      throw ConfigError("cron: time zone '" + std::string(tz) +
                        "' is unknown; use an IANA name such as UTC or Europe/Paris");
    }
    zone_name_ = std::string(tz);
  }

  SysSeconds next_after(SysSeconds t) const override {
    using namespace std::chrono;
    const auto local_now = zone_->to_local(t);
    auto day = date::floor<date::days>(local_now);
    const auto last_day = day + date::days(366 * 8);
    for (; day <= last_day; day += date::days(1)) {
      const date::year_month_day ymd(day);
      if (!month_.test(static_cast<unsigned>(ymd.month()))) continue;
      const bool dom_ok = dom_.test(static_cast<unsigned>(ymd.day()));
      const bool dow_ok = dow_.test(date::weekday(day).c_encoding());
      const bool day_ok = dom_star_ || dow_star_ ? (dom_ok && dow_ok) : (dom_ok || dow_ok);
      if (!day_ok) continue;
      for (int h = 0; h < 24; ++h) {
        if (!hour_.test(static_cast<std::size_t>(h))) continue;
        for (int m = 0; m < 60; ++m) {
          if (!minute_.test(static_cast<std::size_t>(m))) continue;
          const auto local = date::local_seconds(day) + hours(h) + minutes(m);
          const auto info = zone_->get_info(local);
          if (info.result == date::local_info::nonexistent) continue;  // skipped by a DST jump
          const auto sys = zone_->to_sys(local, date::choose::earliest);
          if (sys > t) return SysSeconds(sys.time_since_epoch());
        }
      }
    }
    throw std::runtime_error("cron: '" + text_ + "' never fires");
  }

  std::string describe() const override { return text_ + " " + zone_name_; }

 private:
  std::string text_;
  std::string zone_name_;
  std::bitset<60> minute_;
  std::bitset<24> hour_;
  std::bitset<32> dom_;
  std::bitset<13> month_;
  std::bitset<8> dow_;
  bool dom_star_ = false;
  bool dow_star_ = false;
  const date::time_zone* zone_ = nullptr;
};

}  // namespace

std::unique_ptr<Schedule> every(std::chrono::milliseconds interval) {
  if (interval < std::chrono::seconds(1) || interval.count() % 1000 != 0) {
    throw ConfigError("every: the interval must be a whole number of seconds, at least 1s (got " +
                      std::to_string(interval.count()) + "ms)");
  }
  return std::make_unique<EverySchedule>(
      std::chrono::duration_cast<std::chrono::seconds>(interval));
}

std::unique_ptr<Schedule> cron(std::string_view expression, std::string_view tz) {
  return std::make_unique<CronSchedule>(expression, tz);
}

}  // namespace baton::detail
