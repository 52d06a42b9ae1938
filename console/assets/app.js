// baton console: one page, no framework, nothing fetched from elsewhere. Every value from the
// server goes into the page as text (never as markup), and the server's Content-Security-Policy
// allows this script only.
'use strict';

const POLL_MS = 2000;
const state = { session: null, view: null, busy: false };

// ---- small helpers -------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const text = (v) => (v === null || v === undefined ? '–' : String(v));
// Times as the database wrote them, shown alike: "2026-11-23 21:29:57.501 UTC".
const when = (v) => (v === null || v === undefined ? '–'
  : String(v).replace('T', ' ').replace(/(\.\d{3})\d*/, '$1').replace(/(\+00(:00)?|Z)$/, ' UTC'));
const pill = (v, extra) => el('span', { class: 'pill ' + (extra || v) }, text(v));
const jobLink = (id) => el('a', { href: '#job/' + Number(id), 'data-job-id': Number(id) }, String(id));
const num = (v) => el('td', { class: 'num' }, text(v));

function table(headers, rows, attrs) {
  return el('table', attrs || {},
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { class: h.num ? 'num' : null }, h.label || h)))),
    el('tbody', {}, rows.length ? rows : el('tr', {}, el('td', { colspan: headers.length, class: 'muted' }, 'none'))));
}

function seconds(v) {
  if (v === null || v === undefined) return '–';
  const s = Number(v);
  if (s < 1) return Math.round(s * 1000) + ' ms';
  if (s < 120) return s.toFixed(1) + ' s';
  if (s < 7200) return Math.round(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

function spark(points, key, cls) {
  const w = 120, h = 24;
  const values = points.map((p) => Number(p[key] || 0));
  const max = Math.max(1, ...values);
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'spark ' + (cls || ''));
  svg.setAttribute('width', w);
  svg.setAttribute('height', h);
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  const line = document.createElementNS(ns, 'polyline');
  const step = values.length > 1 ? w / (values.length - 1) : w;
  line.setAttribute('points', values.map((v, i) => `${(i * step).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`).join(' '));
  svg.append(line);
  const title = document.createElementNS(ns, 'title');
  title.textContent = `${key}: max ${max} a minute, last hour`;
  svg.append(title);
  return svg;
}

async function get(path) {
  const r = await fetch(path, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  const body = await r.json().catch(() => ({ error: r.status + ' ' + r.statusText }));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

async function act(body) {
  const r = await fetch('/api/action', {
    method: 'POST', credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json', 'X-Baton-Csrf': state.session.csrf },
    body: JSON.stringify(body),
  });
  const b = await r.json().catch(() => ({ error: r.status + ' ' + r.statusText }));
  if (!r.ok) throw new Error(b.error || r.statusText);
  return b;
}

function notice(message, bad) {
  const n = document.getElementById('notice');
  n.textContent = message;
  n.className = 'notice' + (bad ? ' bad' : '');
  n.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { n.hidden = true; }, 8000);
}

// Every action goes through this confirmation.
function confirmThen(question, action) {
  const d = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = question;
  d.returnValue = '';
  d.onclose = async () => {
    if (d.returnValue !== 'ok') return;
    try {
      const r = await act(action);
      notice(r.message);
    } catch (e) {
      notice(e.message, true);
    }
    refresh();
  };
  d.showModal();
}

const canAct = () => state.session && !state.session.read_only;

function params(query) {
  const out = {};
  new URLSearchParams(query || '').forEach((v, k) => { if (v !== '') out[k] = v; });
  return out;
}

function searchForm(fields, values, onsubmit) {
  const form = el('form', { class: 'search' });
  for (const f of fields) {
    if (f.options) {
      form.append(el('select', { name: f.name, 'aria-label': f.label },
        f.options.map((o) => el('option', { value: o, selected: values[f.name] === o }, o || f.label))));
    } else {
      form.append(el('input', { name: f.name, placeholder: f.label, 'aria-label': f.label, value: values[f.name] || '' }));
    }
  }
  form.append(el('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v !== '') q.set(k, v);
    onsubmit(q.toString());
  });
  return form;
}

// ---- pages ---------------------------------------------------------------------------------
// Each page builds its frame once (forms keep their focus) and refills its results on every poll.

const REASONS = {
  first: () => 'first leader of this lock',
  again: () => 'the same node again',
  after_release: (e) => `after ${text(e.previous_node)} released epoch ${text(e.previous_epoch)}`,
  lease_expired: (e) => `${text(e.previous_node)}'s lease (epoch ${text(e.previous_epoch)}) expired; last renewed ${seconds(e.previous_renewed_s_ago)} before`,
  session_ended: (e) => `${text(e.previous_node)}'s session ended while its lease (epoch ${text(e.previous_epoch)}) still ran: its process died or lost the database; last renewed ${seconds(e.previous_renewed_s_ago)} before`,
};

const pages = {
  cluster: {
    title: 'Cluster',
    async fill(box) {
      const c = await get('/api/cluster');
      const leader = c.leaders.find((l) => l.lease_valid) || null;
      const live = c.nodes.filter((n) => n.status === 'live').length;
      box.replaceChildren(
        el('div', { class: 'cards' },
          el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Leader'),
            el('div', { class: 'big', id: 'leader-node' }, leader ? leader.leader : 'none')),
          el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Epoch'),
            el('div', { class: 'big', id: 'leader-epoch' }, leader ? leader.epoch : '–')),
          el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Lease renewed'),
            el('div', { class: 'big' }, leader ? seconds(leader.renewed_s_ago) + ' ago' : '–')),
          el('div', { class: 'card' }, el('div', { class: 'muted' }, 'Live nodes'),
            el('div', { class: 'big', id: 'live-nodes' }, live))),
        canAct() && leader ? el('p', {}, el('button', {
          class: 'danger', id: 'step-down',
          onclick: () => confirmThen(`Ask ${leader.leader} to drain and step down? Another node takes over.`, { action: 'step_down', node: leader.leader }),
        }, 'Ask the leader to step down')) : null,
        el('h2', {}, 'Lock rows'),
        table(['Lock', 'Leader', 'Epoch', 'Since', 'Renewed', 'Lease', 'Host', 'Metrics'],
          c.leaders.map((l) => el('tr', {}, el('td', {}, `${l.region}/${l.lock_key}`), el('td', {}, text(l.leader)),
            num(l.epoch), el('td', {}, when(l.since)), el('td', {}, seconds(l.renewed_s_ago) + ' ago'),
            el('td', {}, pill(l.lease_valid ? 'valid' : 'expired', l.lease_valid ? 'live' : 'dead')),
            el('td', {}, text(l.host)), el('td', {}, text(l.metrics_addr))))),
        el('h2', {}, 'Nodes (seen in the last hour)'),
        table(['Node', 'Role', 'Status', 'Host', 'Pid', 'Version', 'Last seen', 'Last epoch', 'Group'],
          c.nodes.map((n) => el('tr', { 'data-node': n.node_id }, el('td', {}, n.node_id), el('td', {}, pill(n.role)),
            el('td', {}, pill(n.status)), el('td', {}, text(n.host)), num(n.pid), el('td', {}, text(n.version)),
            el('td', {}, seconds(n.last_seen_s_ago) + ' ago'), num(n.last_epoch), el('td', {}, text(n.lock_group))))),
        el('h2', {}, 'Leadership timeline'),
        table(['At (UTC)', 'Event', 'Node', 'Epoch', 'Why'],
          c.timeline.map((e) => el('tr', { class: 'timeline', 'data-event': e.event, 'data-node': e.node_id, 'data-epoch': e.epoch },
            el('td', {}, when(e.at)), el('td', {}, pill(e.event)), el('td', {}, e.node_id), num(e.epoch),
            el('td', {}, e.event === 'granted' && Object.hasOwn(REASONS, e.reason) ? REASONS[e.reason](e) : String(e.reason).replace('_', ' ')))),
          { id: 'timeline' }));
    },
  },

  queues: {
    title: 'Queues',
    series: null,
    seriesAt: 0,
    async fill(box) {
      // The hourly figures are extra: the depths show even when they cannot be read.
      const [qs] = await Promise.all([get('/api/queues'),
        (async () => {
          if (Date.now() - this.seriesAt < 15000) return;
          this.seriesAt = Date.now();
          try { this.series = await get('/api/series'); } catch (e) { this.series = null; }
        })()]);
      const series = this.series || {};
      const names = new Set(qs.map((q) => q.queue));
      const rows = qs.slice();
      for (const name of Object.keys(series)) if (!names.has(name)) rows.push({ queue: name, paused: false });
      box.replaceChildren(table(
        ['Queue', 'State', { label: 'Available', num: 1 }, { label: 'Scheduled', num: 1 }, { label: 'Running', num: 1 },
          { label: 'Dead', num: 1 }, 'Oldest waiting', { label: 'Done last min', num: 1 }, 'Done / min, last hour',
          'Dead / min', 'Wait p50', 'Run p50', ''],
        rows.map((q) => {
          const pts = series[q.queue] || [];
          const last = pts.length ? pts[pts.length - 1] : {};
          const prev = pts.length > 1 ? pts[pts.length - 2] : {};
          const latest = (k) => { for (let i = pts.length - 1; i >= 0; i--) if (pts[i][k] !== null) return pts[i][k]; return null; };
          return el('tr', { 'data-queue': q.queue },
            el('td', {}, el('a', { href: '#jobs?queue=' + encodeURIComponent(q.queue) }, q.queue)),
            el('td', {}, pill(q.paused ? 'paused' : 'active', q.paused ? 'paused' : 'live')),
            num(q.available ?? 0), num(q.scheduled ?? 0), num(q.running ?? 0), num(q.dead ?? 0),
            el('td', {}, seconds(q.oldest_available_s)),
            num((prev.completed || 0) > (last.completed || 0) ? prev.completed : (last.completed || 0)),
            el('td', {}, spark(pts, 'completed')), el('td', {}, spark(pts, 'dead', 'dead')),
            el('td', {}, latest('wait_p50_ms') === null ? '–' : seconds(latest('wait_p50_ms') / 1000)),
            el('td', {}, latest('run_p50_ms') === null ? '–' : seconds(latest('run_p50_ms') / 1000)),
            el('td', {}, canAct() ? el('button', {
              'data-action': q.paused ? 'resume' : 'pause',
              onclick: () => confirmThen(`${q.paused ? 'Resume' : 'Pause'} queue ${q.queue}?` + (q.paused ? '' : ' The leader claims none of its jobs until it is resumed.'),
                { action: q.paused ? 'resume' : 'pause', queue: q.queue }),
            }, q.paused ? 'Resume' : 'Pause') : null));
        }), { id: 'queues' }));
    },
  },

  jobs: {
    title: 'Jobs',
    frame(box, query) {
      const values = params(query);
      box.append(searchForm([
        { name: 'id', label: 'id' }, { name: 'queue', label: 'queue' }, { name: 'type', label: 'type' },
        { name: 'state', label: 'any state', options: ['', 'available', 'scheduled', 'running', 'completed', 'cancelled', 'dead'] },
        { name: 'key', label: 'partition key' },
      ], values, (q) => { location.hash = '#jobs?' + q; }));
      return new URLSearchParams(values).toString();
    },
    async fill(box, query) {
      const r = await get('/api/jobs?' + query);
      box.replaceChildren(
        el('p', { class: 'muted' }, `Newest first, at most ${r.limit}.`),
        table(['Id', 'Queue', 'Type', 'State', { label: 'Attempts', num: 1 }, 'Partition key', 'Enqueued', 'Last error'],
          r.jobs.map((j) => el('tr', { 'data-job': j.id }, el('td', {}, jobLink(j.id)), el('td', {}, j.queue), el('td', {}, j.type),
            el('td', {}, pill(j.state)), num(j.attempts), el('td', {}, text(j.partition_key)), el('td', {}, when(j.created_at)),
            el('td', { class: 'err' }, text(j.last_error)))), { id: 'jobs' }));
    },
  },

  job: {
    title: 'Job',
    async fill(box, id) {
      const r = await get('/api/job?id=' + encodeURIComponent(id));
      const j = r.job;
      const state = j.status === 'live' ? j.now : j.status === 'finished' ? j.outcome : 'dead';
      const kv = el('dl', { class: 'kv', id: 'job' });
      const add = (k, v) => kv.append(el('dt', {}, k), el('dd', {}, v));
      add('Id', String(j.id));
      add('State', pill(state));
      for (const k of ['queue', 'type', 'partition_key', 'priority', 'attempts', 'max_attempts', 'idempotency_key', 'reason']) {
        if (k in j) add(k.replace('_', ' '), text(j[k]));
      }
      add('Payload', el('pre', {}, JSON.stringify(j.payload, null, 2)));
      box.replaceChildren(
        el('h2', {}, `Job ${j.id}`), kv,
        j.status === 'dead' && canAct() ? el('p', {},
          el('button', { id: 'retry-job', onclick: () => confirmThen(`Put dead job ${j.id} back in its queue with fresh attempts?`, { action: 'retry', ids: [j.id] }) }, 'Retry'), ' ',
          el('button', { class: 'danger', id: 'discard-job', onclick: () => confirmThen(`Delete dead job ${j.id} for good?`, { action: 'discard', ids: [j.id] }) }, 'Discard')) : null,
        el('h2', {}, 'Story'),
        table(['At', 'Event', 'Node', 'Epoch', 'Detail'],
          r.story.map((s) => el('tr', {}, el('td', {}, when(s.at)), el('td', {}, s.event), el('td', {}, text(s.node)),
            num(s.epoch), el('td', { class: /failed|dead/.test(s.event) ? 'err' : null }, text(s.detail)))), { id: 'story' }));
    },
  },

  dead: {
    title: 'Dead letters',
    frame(box, query) {
      const values = params(query);
      box.append(searchForm([{ name: 'queue', label: 'queue' }], values, (q) => { location.hash = '#dead?' + q; }));
      return new URLSearchParams(values).toString();
    },
    // Ticked rows stay ticked across refreshes (while they are still dead letters).
    chosen: new Set(),
    async fill(box, query) {
      const r = await get('/api/dead?' + query);
      const queue = params(query).queue || '';
      const shown = new Set(r.dead.map((d) => d.id));
      for (const id of [...this.chosen]) if (!shown.has(id)) this.chosen.delete(id);
      const chosen = () => [...this.chosen];
      const rows = r.dead.map((d) => {
        const c = el('input', { type: 'checkbox', value: d.id, 'aria-label': 'select ' + d.id, checked: this.chosen.has(d.id) });
        c.addEventListener('change', () => { if (c.checked) this.chosen.add(d.id); else this.chosen.delete(d.id); });
        return el('tr', { 'data-dead': d.id }, el('td', {}, canAct() ? c : null), el('td', {}, jobLink(d.id)), el('td', {}, d.queue),
          el('td', {}, d.type), num(d.attempts), el('td', {}, d.reason), el('td', {}, when(d.died_at)), el('td', { class: 'err' }, text(d.last_error)));
      });
      box.replaceChildren(
        el('p', { class: 'muted', id: 'dead-total' }, `${r.total} dead letters${queue ? ' in ' + queue : ''}; newest ${Math.min(r.total, r.limit)} shown.`),
        canAct() ? el('p', {},
          el('button', { id: 'retry-selected', onclick: () => { const ids = chosen(); if (ids.length) confirmThen(`Retry ${ids.length} dead letters?`, { action: 'retry', ids }); } }, 'Retry selected'), ' ',
          el('button', { class: 'danger', id: 'discard-selected', onclick: () => { const ids = chosen(); if (ids.length) confirmThen(`Delete ${ids.length} dead letters for good?`, { action: 'discard', ids }); } }, 'Discard selected'), ' ',
          el('button', { id: 'retry-all', onclick: () => confirmThen(`Retry all ${r.total} dead letters${queue ? ' of ' + queue : ''}?`, { action: 'retry_all', queue }) }, queue ? 'Retry all of ' + queue : 'Retry all')) : null,
        table(['', 'Id', 'Queue', 'Type', { label: 'Attempts', num: 1 }, 'Reason', 'Died (UTC)', 'Last error'], rows, { id: 'dead' }));
    },
  },

  schedules: {
    title: 'Schedules',
    async fill(box) {
      const r = await get('/api/schedules');
      box.replaceChildren(table(['Name', 'Spec', 'Type', 'Queue', 'Active', 'Last tick', 'Next tick', 'Last run', 'Missed'],
        r.map((s) => el('tr', { 'data-schedule': s.name }, el('td', {}, s.name), el('td', {}, s.spec), el('td', {}, s.type), el('td', {}, s.queue),
          el('td', {}, s.active ? 'yes' : 'no'), el('td', {}, when(s.last_tick)), el('td', {}, when(s.next_tick)),
          el('td', {}, s.last_run ? pill(s.last_run) : '–', s.last_job_id ? [' ', jobLink(s.last_job_id)] : null), el('td', {}, text(s.missed)))),
        { id: 'schedules' }));
    },
  },

  sagas: {
    title: 'Sagas',
    frame(box, query) {
      const values = params(query);
      box.append(searchForm([{ name: 'id', label: 'id' }, { name: 'type', label: 'type' },
        { name: 'property', label: 'property' }, { name: 'value', label: 'value' }], values, (q) => { location.hash = '#sagas?' + q; }));
      return new URLSearchParams(values).toString();
    },
    async fill(box, query) {
      const r = await get('/api/sagas?' + query);
      const one = r.sagas.length === 1 && 'data' in r.sagas[0] ? r.sagas[0] : null;
      box.replaceChildren(
        table(['Id', 'Type', { label: 'Version', num: 1 }, 'Indexed by', 'Updated', 'Completed'],
          r.sagas.map((s) => el('tr', { 'data-saga': s.id }, el('td', {}, el('a', { href: '#sagas?id=' + encodeURIComponent(s.id) }, s.id)),
            el('td', {}, s.type), num(s.version), el('td', {}, typeof s.indexed === 'object' && s.indexed !== null ? JSON.stringify(s.indexed) : text(s.indexed)),
            el('td', {}, when(s.updated_at)), el('td', {}, when(s.completed_at)))), { id: 'sagas' }),
        one ? [el('h2', {}, 'State'), el('pre', { id: 'saga-data' }, JSON.stringify(one.data, null, 2))] : null);
    },
  },
};

// ---- navigation and polling ----------------------------------------------------------------

function route() {
  const hash = location.hash.slice(1) || 'cluster';
  const [head, query] = [hash.split('?')[0], hash.includes('?') ? hash.slice(hash.indexOf('?') + 1) : ''];
  const [name, arg] = head.split('/');
  const page = Object.hasOwn(pages, name) ? name : 'cluster';
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.dataset.page === page || (page === 'job' && a.dataset.page === 'jobs'));
  const main = document.getElementById('page');
  main.replaceChildren(el('h2', {}, pages[page].title));
  const results = el('div', { id: 'results' });
  let key = page === 'job' ? arg : query;
  if (pages[page].frame) key = pages[page].frame(main, query);
  main.append(results);
  document.title = 'baton · ' + pages[page].title;
  state.view = { page, key, results };
  refresh();
}

async function refresh() {
  if (state.busy || !state.view) return;
  state.busy = true;
  const view = state.view;
  const status = document.getElementById('status');
  try {
    await pages[view.page].fill(view.results, view.key);
    status.textContent = 'updated ' + new Date().toLocaleTimeString();
    status.className = 'status';
  } catch (e) {
    if (view === state.view) {
      view.results.replaceChildren(el('p', { class: 'err', id: 'error' }, e.message));
    }
    status.textContent = 'not updated';
    status.className = 'status bad';
  } finally {
    state.busy = false;
  }
}

async function start() {
  try {
    state.session = await get('/api/session');
  } catch (e) {
    document.getElementById('page').replaceChildren(el('p', { class: 'err', id: 'error' }, e.message));
    return;
  }
  const s = state.session;
  document.getElementById('whoami').textContent =
    `node ${s.node} · schema ${s.schema} · ${s.version}${s.read_only ? ' · read-only' : ''}`;
  document.body.dataset.ready = '1';
  window.addEventListener('hashchange', route);
  route();
  setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
}

start();
