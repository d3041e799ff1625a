// The consensusd dashboard: polls /api/cluster (what `consensusctl
// dashboard` gathers from every node's status socket) and draws the graph,
// the time series and the table. Read-only; no third-party code.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
// Series key, title, digits, and the range always shown ([lo, hi], or none).
const CHARTS = [
  ['accuracy', 'test accuracy', 3],
  ['loss', 'training loss (EWMA)', 4],
  ['rounds_per_s', 'rounds per second', 1, [0, 0]],
  ['m', 'neighbours waited for (m)', 0, [0, 1]],
  ['consensus_distance', 'consensus distance', 4, [0, 0]],
  ['bytes_per_s', 'bytes per second (in + out)', 0, [0, 0]],
  ['timeout_share', 'share of rounds cut off by time', 2, [0, 1]],
];
const COLUMNS = [
  ['node', 'node', (n) => n.id, 'text'],
  ['round', 'round', (n) => get(n, 'round')],
  ['lag', 'lag', (n) => (n.lag === undefined ? null : n.lag)],
  ['rounds_per_s', 'rounds/s', (n) => get(n, 'rounds_per_s'), 1],
  ['loss', 'loss', (n) => get(n, 'loss'), 4],
  ['accuracy', 'acc', (n) => positive(get(n, 'accuracy')), 4],
  ['m', 'm', (n) => get(n, 'target')],
  ['backups', 'b', (n) => get(n, 'backups')],
  ['responders', 'resp', (n) => get(n, 'responders')],
  ['suspects', 'susp', (n) => get(n, 'suspects')],
  ['rejects', 'rejects', (n) => total(get(n, 'rejects'))],
  ['discarded', 'discards', (n) => total(get(n, 'discarded'))],
  ['in_mbit', 'in Mbit/s', (n) => inMbit(n), 1],
  ['sent_mb', 'sent MB', (n) => scaled(get(n, 'bytes_sent'), 1e-6), 1],
  ['per_sample', 'kB/sample', (n) => scaled(get(n, 'sent_bytes_per_sample'), 1e-3), 2],
  ['state', 'state', (n) => n.state, 'text'],
  ['trainer', 'trainer', (n) => trainerState(n), 'text'],
];

const view = {
  since: -1,
  refreshMs: 1000,
  keepS: 300,
  data: null,
  series: new Map(),  // node id -> {t: [], accuracy: [], ...}
  selected: null,
  sortKey: 'node',
  sortUp: true,
  built: false,
};

function get(node, key) {
  const s = node.status;
  return s && s[key] !== undefined ? s[key] : null;
}
function positive(x) { return x === null || x < 0 ? null : x; }
function scaled(x, by) { return x === null ? null : x * by; }
function total(map) {
  if (!map) return null;
  return Object.values(map).reduce((a, b) => a + b, 0);
}
function inMbit(node) {
  const s = node.status;
  if (!s || !s.neighbors) return null;
  return s.neighbors.reduce((a, n) => a + (n.bytes_per_s || 0), 0) * 8 / 1e6;
}
function trainerState(node) {
  const t = get(node, 'trainer');
  if (!t) return '';
  return t.attached ? 'attached (pid ' + t.pid + ')' : 'none attached';
}
function format(x, digits) {
  if (x === null || x === undefined) return '-';
  if (typeof x !== 'number') return String(x);
  return digits === undefined ? String(x) : x.toFixed(digits);
}
function el(tag, attributes, text) {
  const e = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4))
                                   : document.createElement(tag);
  for (const [k, v] of Object.entries(attributes || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// How far behind the newest round a node is, in seconds of its own rounds
// (the nodes are polled one after another, so a few rounds mean nothing).
function lagSeconds(node) {
  const rate = get(node, 'rounds_per_s');
  if (!node.lag) return 0;
  return rate > 0 ? node.lag / rate : Infinity;
}
// Colours: a node by its state, or by its lag behind the newest round.
function nodeColour(node) {
  switch (node.state) {
    case 'stopped': return '#9a9a9a';
    case 'not started': return '#ffffff';
    case 'suspect': return '#d0342c';
    case 'paused': return '#8a63c9';
  }
  const behind = lagSeconds(node);
  if (behind <= 1) return '#2e9d4a';
  if (behind <= 10) return '#c9b420';
  return '#e07b22';
}
// An edge by the share of estimates in time: red (none) to green (all).
function edgeColour(share) {
  if (share === null || share === undefined) return '#cccccc';
  const r = Math.round(208 + (46 - 208) * share);
  const g = Math.round(52 + (157 - 52) * share);
  const b = Math.round(44 + (74 - 44) * share);
  return 'rgb(' + r + ',' + g + ',' + b + ')';
}
const PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                 '#7f7f7f', '#bcbd22', '#17becf'];
function lineColour(index) { return PALETTE[index % PALETTE.length]; }

function buildGraph(data) {
  const svg = document.getElementById('graph');
  svg.textContent = '';
  const position = new Map(data.nodes.map((n) => [n.id, [30 + 540 * n.x, 30 + 540 * n.y]]));
  const radius = Math.max(6, Math.min(18, 220 / Math.sqrt(data.nodes.length + 1)));
  const edges = el('svg:g', {class: 'edges'});
  // Each arc as the half of the line at its receiver: coloured by what that receiver gets.
  for (const e of data.edges) {
    const [x1, y1] = position.get(e.to);
    const [x2, y2] = position.get(e.from);
    const line = el('svg:line', {x1, y1, x2: (x1 + x2) / 2, y2: (y1 + y2) / 2,
                                 'data-from': e.from, 'data-to': e.to});
    line.appendChild(el('svg:title'));
    edges.appendChild(line);
  }
  svg.appendChild(edges);
  const nodes = el('svg:g', {class: 'nodes'});
  for (const n of data.nodes) {
    const [x, y] = position.get(n.id);
    const g = el('svg:g', {class: 'node', 'data-node': n.id});
    g.appendChild(el('svg:circle', {cx: x, cy: y, r: radius}));
    g.appendChild(el('svg:title'));
    g.appendChild(el('svg:text', {x, y: y + radius + 11}, n.id));
    g.addEventListener('click', () => select(n.id));
    nodes.appendChild(g);
  }
  svg.appendChild(nodes);
}

function updateGraph(data) {
  const byId = new Map(data.nodes.map((n) => [n.id, n]));
  for (const g of document.querySelectorAll('#graph .node')) {
    const n = byId.get(g.getAttribute('data-node'));
    g.setAttribute('data-state', n.state);
    g.setAttribute('data-round', get(n, 'round') === null ? '' : get(n, 'round'));
    g.classList.toggle('not-started', n.state === 'not started');
    g.classList.toggle('selected', n.id === view.selected);
    g.querySelector('circle').setAttribute('fill', nodeColour(n));
    g.querySelector('title').textContent = n.id + ': ' + n.state +
        (n.status ? ', round ' + n.status.round + ', lag ' + n.lag + ', m ' + n.status.target +
                    '/' + n.status.degree + ', ' + format(n.status.rounds_per_s, 1) +
                    ' rounds/s, accuracy ' + format(positive(n.status.accuracy), 4)
                  : '');
  }
  const shares = new Map(data.edges.map((e) => [e.from + '>' + e.to, e.in_time]));
  for (const line of document.querySelectorAll('#graph line')) {
    const from = line.getAttribute('data-from');
    const to = line.getAttribute('data-to');
    const share = shares.get(from + '>' + to);
    line.setAttribute('stroke', edgeColour(share));
    line.setAttribute('data-in-time', share === null ? '' : share.toFixed(3));
    line.querySelector('title').textContent = from + ' \u2192 ' + to + ': ' +
        (share === null ? 'no estimates in the last minute'
                        : Math.round(100 * share) + '% of estimates in time (last minute)');
  }
}

function mergeSeries(data) {
  for (const n of data.nodes) {
    let s = view.series.get(n.id);
    if (!s) {
      s = {};
      for (const key of ['t'].concat(CHARTS.map((c) => c[0]))) s[key] = [];
      view.series.set(n.id, s);
    }
    for (const key of Object.keys(s)) s[key].push(...(n.series[key] || []));
    let drop = 0;
    while (drop < s.t.length && s.t[drop] < data.t - view.keepS) drop++;
    if (drop > 0) for (const key of Object.keys(s)) s[key].splice(0, drop);
  }
}

function buildCharts() {
  const charts = document.getElementById('charts');
  charts.textContent = '';
  for (const [key, title] of CHARTS) {
    const figure = el('figure', {'data-series': key});
    figure.appendChild(el('figcaption', {}, title));
    figure.appendChild(el('svg:svg', {viewBox: '0 0 400 150', preserveAspectRatio: 'none'}));
    charts.appendChild(figure);
  }
}

function updateCharts(data) {
  // From the first point kept (or keep_s back) to now.
  const t1 = data.t;
  let t0 = t1;
  for (const s of view.series.values()) if (s.t.length > 0) t0 = Math.min(t0, s.t[0]);
  t0 = Math.max(t0, t1 - view.keepS);
  for (const [key, , digits, range] of CHARTS) {
    const svg = document.querySelector('#charts figure[data-series="' + key + '"] svg');
    svg.textContent = '';
    let lo = range ? range[0] : Infinity;
    let hi = range ? range[1] : -Infinity;
    let any = false;
    for (const s of view.series.values()) {
      for (const v of s[key]) {
        if (v === null) continue;
        any = true;
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
    if (!any) {
      svg.appendChild(el('svg:text', {x: 200, y: 80, class: 'axis', 'text-anchor': 'middle'},
                         'no data yet'));
      continue;
    }
    if (hi === lo) { hi += Math.abs(hi) * 0.1 || 1; lo -= Math.abs(lo) * 0.1; }
    const x = (t) => 40 + 355 * (t - t0) / (t1 - t0 || 1);
    const y = (v) => 140 - 130 * (v - lo) / (hi - lo);
    svg.appendChild(el('svg:text', {x: 2, y: 14, class: 'axis'}, format(hi, digits)));
    svg.appendChild(el('svg:text', {x: 2, y: 140, class: 'axis'}, format(lo, digits)));
    svg.appendChild(el('svg:line', {x1: 40, y1: 140, x2: 395, y2: 140, stroke: '#ccc'}));
    data.nodes.forEach((n, index) => {
      const s = view.series.get(n.id);
      let points = [];
      const flush = () => {
        if (points.length > 0) {
          svg.appendChild(el('svg:polyline', {points: points.join(' '), stroke: lineColour(index),
                                              'data-node': n.id}));
        }
        points = [];
      };
      for (let k = 0; k < s.t.length; k++) {
        const v = s[key][k];
        if (v === null || s.t[k] < t0) { flush(); continue; }  // a gap where it did not answer
        points.push(x(s.t[k]).toFixed(1) + ',' + y(v).toFixed(1));
      }
      flush();
    });
  }
}

function buildTable() {
  const head = document.querySelector('#nodes thead');
  const row = el('tr');
  for (const [key, title] of COLUMNS) {
    const th = el('th', {'data-key': key}, title);
    th.addEventListener('click', () => {
      view.sortUp = view.sortKey === key ? !view.sortUp : true;
      view.sortKey = key;
      updateTable(view.data);
    });
    row.appendChild(th);
  }
  head.appendChild(row);
}

function compareIds(a, b) {
  return a.localeCompare(b, undefined, {numeric: true});
}

function updateTable(data) {
  const body = document.querySelector('#nodes tbody');
  const column = COLUMNS.find((c) => c[0] === view.sortKey);
  const rows = data.nodes.slice();
  rows.sort((a, b) => {
    const va = column[2](a);
    const vb = column[2](b);
    let order;
    if (va === null || vb === null) order = (va === null) - (vb === null);
    else if (typeof va === 'string') order = compareIds(va, vb);
    else order = va - vb;
    if (order === 0) order = compareIds(a.id, b.id);
    return view.sortUp ? order : -order;
  });
  body.textContent = '';
  for (const n of rows) {
    const tr = el('tr', {'data-node': n.id, class: n.state.replace(' ', '-')});
    if (n.id === view.selected) tr.classList.add('selected');
    for (const [key, , value, digits] of COLUMNS) {
      const text = digits === 'text' ? value(n) : format(value(n), digits);
      tr.appendChild(el('td', {'data-key': key, class: digits === 'text' ? 'text' : ''}, text));
    }
    tr.addEventListener('click', () => select(n.id));
    body.appendChild(tr);
  }
  for (const th of document.querySelectorAll('#nodes th')) {
    const key = th.getAttribute('data-key');
    const title = COLUMNS.find((c) => c[0] === key)[1];
    th.textContent = title + (key === view.sortKey ? (view.sortUp ? ' \u25b2' : ' \u25bc') : '');
  }
}

function table(rows) {
  const t = el('table');
  for (const cells of rows) {
    const tr = el('tr');
    cells.forEach((c, i) => tr.appendChild(el(i === 0 ? 'th' : 'td', {}, c)));
    t.appendChild(tr);
  }
  return t;
}

function updateDetails(data) {
  const panel = document.getElementById('details');
  const n = data.nodes.find((m) => m.id === view.selected);
  if (!n) return;
  panel.textContent = '';
  panel.appendChild(el('h2', {}, n.id + ' \u2014 ' + n.state));
  const s = n.status;
  if (!s) {
    panel.appendChild(el('p', {class: 'hint'}, n.state === 'stopped'
        ? 'It answered before and does not now: stopped, or its status socket is gone.'
        : 'It has not answered since the dashboard started.'));
    return;
  }
  panel.appendChild(table([
    ['round', String(s.round) + ' (lag ' + n.lag + ')'],
    ['phase', s.phase],
    ['policy', s.policy + ', m ' + s.target + ' of ' + s.degree],
    ['rounds/s', format(s.rounds_per_s, 2)],
    ['loss / accuracy', format(s.loss, 4) + ' / ' + format(positive(s.accuracy), 4)],
    ['consensus distance', format(s.consensus_distance, 5)],
    ['cut-offs', Object.entries(s.cutoffs || {}).map(([k, v]) => k + ' ' + v).join(', ') || '-'],
    ['rejects', Object.entries(s.rejects || {}).map(([k, v]) => k + ' ' + v).join(', ') || 'none'],
    ['discards', Object.entries(s.discarded || {}).map(([k, v]) => k + ' ' + v).join(', ') || 'none'],
    ['trainer', trainerState(n) || 'built-in model'],
    ['last checkpoint', String(s.last_checkpoint_round)],
    ['topology', s.topology + ' (' + s.topology_hash + ')'],
    ['uptime', format(s.uptime_s, 0) + ' s, version ' + s.version],
  ]));
  const rows = [['neighbour', 'state', 'last round', 'median ms', 'on time', 'late', 'rejected']];
  for (const m of s.neighbors || []) {
    rows.push([m.id, m.state, String(m.last_round), format(m.median_arrival_ms, 1),
               String(m.on_time), String(m.late), String(m.rejected)]);
  }
  panel.appendChild(table(rows));
}

function select(id) {
  view.selected = id;
  if (view.data) render(view.data);
}

function render(data) {
  updateGraph(data);
  updateCharts(data);
  updateTable(data);
  updateDetails(data);
}

function setConnection(text, bad) {
  const c = document.getElementById('connection');
  c.textContent = text;
  c.classList.toggle('bad', bad);
}

async function poll() {
  try {
    const response = await fetch('/api/cluster?since=' + view.since, {cache: 'no-store'});
    if (!response.ok) throw new Error('HTTP ' + response.status);
    const data = await response.json();
    view.refreshMs = data.refresh_ms || view.refreshMs;
    view.keepS = data.keep_s || view.keepS;
    if (!view.built) {
      document.getElementById('name').textContent = data.name + ' (' + data.layout + ')';
      buildGraph(data);
      buildCharts();
      buildTable();
      view.built = true;
    }
    if (data.t < view.since) {  // the dashboard restarted: its clock and series begin again
      view.series.clear();
    }
    view.since = data.t;
    view.data = data;
    mergeSeries(data);
    render(data);
    const counts = {};
    for (const n of data.nodes) counts[n.state] = (counts[n.state] || 0) + 1;
    document.getElementById('summary').textContent = data.nodes.length + ' nodes, newest round ' +
        data.newest_round + ' \u2014 ' +
        Object.entries(counts).map(([k, v]) => v + ' ' + k).join(', ');
    document.body.setAttribute('data-updated', String(data.t));
    setConnection('updated every ' + view.refreshMs + ' ms', false);
  } catch (e) {
    setConnection('cannot reach consensusctl dashboard (' + e.message + '); retrying', true);
  }
  setTimeout(poll, view.refreshMs);
}

poll();
