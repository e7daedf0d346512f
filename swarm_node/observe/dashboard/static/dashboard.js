// Polls the dashboard API and draws the peer table and one chart per metric group.
"use strict";

// `?poll_ms=N` overrides the refresh period (tests use a short one).
const POLL_MS = Number(new URLSearchParams(window.location.search).get("poll_ms")) || 3000;
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
const DASHES = [null, "5 3", "2 2", "8 3 2 3"];

// Each chart plots, for every peer, one line per key (keys differ by dash style).
const CHARTS = [
  { id: "reward", title: "Reward (mean, own samples)", keys: [["reward_mean", "reward"]] },
  { id: "accuracy", title: "Accuracy (own samples; held-out: its own chart)", keys: [["accuracy", "train"]], yMin: 0 },
  { id: "filtered", title: "Filtered fraction by reason", yMin: 0,
    keys: [["filtered_fraction_nonpositive_advantage", "advantage ≤ 0"], ["filtered_fraction_kl", "KL > g"]] },
  { id: "kl", title: "KL per sample (objective.kl_estimator)", keys: [["kl_mean", "mean"], ["kl_p90", "p90"]], yMin: 0 },
  { id: "isw", title: "Importance weights", yMin: 0,
    keys: [["is_weight_mean", "mean"], ["is_weight_peer_mean", "peer mean"], ["is_weight_max", "max"]] },
  { id: "bpt", title: "Bytes per token (published)", keys: [["bytes_per_token", "bytes/token"]], yMin: 0 },
  { id: "rate", title: "Step rate (steps/min)", keys: [["steps_per_min", "steps/min"]], yMin: 0 },
];

// Held-out accuracy over steps: the evaluations the peers' status records carried (each node's latest,
// gathered while the page runs) and the whole trend of the local nodes given with --node-dir.
const HELDOUT = { id: "heldout", title: "Held-out accuracy (greedy pass@1; bars: 95% interval)" };

const peerColor = {};
function colorFor(peer) {
  if (!(peer in peerColor)) peerColor[peer] = COLORS[Object.keys(peerColor).length % COLORS.length];
  return peerColor[peer];
}

function shortId(peer) { return peer.length > 14 ? `${peer.slice(0, 6)}…${peer.slice(-6)}` : peer; }

// A tokenizer: its fingerprint's label and how many of the peers of known tokenizer share it.
function tokenizerCell(p) {
  if (!p.tokenizer_fingerprint) return "–";
  return p.tokenizer_known ? `${p.tokenizer} ${p.tokenizer_peers}/${p.tokenizer_known}` : p.tokenizer;
}

// A ledger peer's tokenizer: its label, and whether it is the local node's.
function ledgerTokenizer(r) {
  if (!r.tokenizer) return "–";
  return r.tokenizer_same === null ? r.tokenizer_label : `${r.tokenizer_label} (${r.tokenizer_same ? "same" : "other"})`;
}

function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  return Number(v).toFixed(digits === undefined ? 3 : digits);
}

function buildCharts() {
  const root = document.getElementById("charts");
  for (const c of [HELDOUT, ...CHARTS]) {
    const fig = document.createElement("figure");
    fig.className = "chart";
    fig.dataset.chart = c.id;
    const cap = document.createElement("figcaption");
    cap.textContent = c.title;
    const keys = document.createElement("div");
    keys.className = "keys";
    keys.textContent = !c.keys ? ""
      : c.keys.length > 1
      ? c.keys.map(([, label], i) => `${label}: ${i === 0 ? "solid" : "dashed"}`).join(" · ") : "";
    fig.append(cap, keys);
    fig.appendChild(document.createElementNS("http://www.w3.org/2000/svg", "svg"));
    root.appendChild(fig);
  }
}

function drawCharts(series) {
  for (const c of CHARTS) {
    const lines = [];
    for (const [peer, s] of Object.entries(series)) {
      c.keys.forEach(([key], i) => {
        const points = s.points.filter((p) => p[key] !== null && p[key] !== undefined).map((p) => [p.step, p[key]]);
        lines.push({ peer, key, points, color: colorFor(peer), dash: DASHES[i % DASHES.length] });
      });
    }
    const svg = document.querySelector(`figure[data-chart="${c.id}"] svg`);
    window.lineChart(svg, lines, { yMin: c.yMin });
  }
}

// A held-out series: points at the evaluated steps, each with its 95% interval.
function heldoutLine(peer, points) {
  return { peer, key: "heldout", points: points.map((e) => [e.step, e.accuracy]),
    bars: points.map((e) => [e.step, e.lo, e.hi]), color: colorFor(peer) };
}

function drawHeldout(series, nodes) {
  const lines = Object.entries(series).filter(([, s]) => s.evals && s.evals.length)
    .map(([peer, s]) => heldoutLine(peer, s.evals));
  for (const node of nodes) if (node.points.length) lines.push(heldoutLine(node.node_dir, node.points));
  const fig = document.querySelector(`figure[data-chart="${HELDOUT.id}"]`);
  window.lineChart(fig.querySelector("svg"), lines, { yMin: 0 });
  // the legend: a swatch per line (peers as in the table, local nodes by directory)
  const keys = fig.querySelector(".keys");
  keys.replaceChildren();
  for (const l of lines) {
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = l.color;
    keys.append(sw, document.createTextNode(`${l.peer.startsWith("/") ? l.peer : shortId(l.peer)}  `));
  }
  if (!lines.length) keys.textContent = "no evaluation yet (eval.problems, eval.every_steps)";
}

// '0.23 [0.15, 0.35] @20': the latest held-out accuracy, its 95% interval and the step it followed.
function heldoutCell(m) {
  if (m.eval_accuracy === null || m.eval_accuracy === undefined) return "–";
  return `${fmt(m.eval_accuracy, 2)} [${fmt(m.eval_lo, 2)}, ${fmt(m.eval_hi, 2)}] @${fmt(m.eval_step, 0)}`;
}

function drawTable(peers, serverTime) {
  const body = document.querySelector("#peers tbody");
  body.replaceChildren();
  for (const p of peers) {
    const m = p.metrics;
    // dropped_<reason> counts one step; total_dropped_<reason> since the node started
    const drops = Object.entries(m).filter(([k]) => k.startsWith("total_dropped_")).reduce((a, [, v]) => a + (v || 0), 0);
    const cells = [
      shortId(p.peer_id), p.model_id, tokenizerCell(p), p.step, fmt(m.reward_mean), fmt(m.accuracy), heldoutCell(m),
      fmt(m.own_samples, 0), fmt(m.peer_samples_used, 0),
      `${fmt(m.filtered_nonpositive_advantage, 0)} / ${fmt(m.filtered_kl, 0)}`, fmt(drops, 0),
      fmt(m.tokens_per_s, 1), p.warning ? `${fmt(m.live_peers, 0)} ⚠ ${p.warning}` : fmt(m.live_peers, 0),
      `${Math.max(0, serverTime - p.last_seen).toFixed(0)} s ago`,
    ];
    const tr = document.createElement("tr");
    tr.dataset.peer = p.peer_id;
    if (!p.present) tr.className = "absent";
    else if (p.warning) tr.className = "warn";
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      if (i === 0) {
        td.className = "peer";
        td.title = p.peer_id;
        const sw = document.createElement("span");
        sw.className = "swatch";
        sw.style.background = colorFor(p.peer_id);
        td.appendChild(sw);
      }
      td.appendChild(document.createTextNode(String(text)));
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

const LEDGER_COLUMNS = ["peer", "taken / offered", "dropped (top reason)", "tokenizer", "samples", "gradient",
  "filtered", "it took ours", "our samples w/ grad there", "it dropped ours", "cross-tok", "x-tok grad", "kl mean",
  "kl p90", "w mean", "w p90", "reward", "reputation", "last seen"];

// What the peer's receipt says it did with this node's groups (its status record; "–": no receipt).
function givenCells(g) {
  if (!g) return ["–", "–", "–"];
  const reasons = Object.entries(g.dropped_by_reason).sort((a, b) => b[1] - a[1]);
  return [String(g.taken), `${g.gradient} / ${g.samples}`,
    reasons.length ? `${g.dropped} (${reasons[0][0]})` : String(g.dropped)];
}

function ledgerCells(r, serverTime) {
  const reasons = Object.entries(r.dropped_by_reason).sort((a, b) => b[1] - a[1]);
  const has = (s) => s.count > 0;
  return [
    shortId(r.peer_id), `${r.taken} / ${r.offered}`, reasons.length ? `${r.dropped} (${reasons[0][0]})` : String(r.dropped),
    ledgerTokenizer(r), r.samples, r.samples ? fmt(r.gradient_share, 2) : "–", r.samples ? fmt(r.filtered_share, 2) : "–",
    ...givenCells(r.given), r.crosstok, r.crosstok ? fmt(r.crosstok_gradient_share, 2) : "–",
    has(r.kl) ? fmt(r.kl.mean) : "–", has(r.kl) ? fmt(r.kl.p90) : "–",
    has(r.is_weight) ? fmt(r.is_weight.mean) : "–", has(r.is_weight) ? fmt(r.is_weight.p90) : "–",
    has(r.reward) ? fmt(r.reward.mean) : "–", r.reputation.excluded ? "excluded" : fmt(r.reputation.weight, 2),
    `${Math.max(0, serverTime - r.last_seen).toFixed(0)} s ago`,
  ];
}

function drawLedger(ledger) {
  const section = document.getElementById("ledger");
  section.hidden = ledger.nodes.length === 0;
  const holder = document.getElementById("ledger-nodes");
  holder.replaceChildren();
  for (const node of ledger.nodes) {
    const h = document.createElement("h3");
    h.textContent = node.error ? `${node.node_dir}: ${node.error}` : `${node.node_dir}: ${node.total_peers} peers`;
    holder.appendChild(h);
    if (node.error) continue;
    const table = document.createElement("table");
    table.className = "ledger";
    const head = table.createTHead().insertRow();
    for (const c of LEDGER_COLUMNS) { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); }
    const body = table.createTBody();
    for (const r of node.peers) {
      const tr = body.insertRow();
      tr.dataset.peer = r.peer_id;
      if (r.reputation.excluded) tr.className = "warn";
      ledgerCells(r, ledger.server_time).forEach((text, i) => {
        const td = tr.insertCell();
        if (i === 0) { td.className = "peer"; td.title = r.peer_id; }
        td.textContent = String(text);
      });
    }
    holder.appendChild(table);
  }
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [peers, history, ledger, heldout] = await Promise.all([getJson("/api/peers"), getJson("/api/history"),
      getJson("/api/ledger"), getJson("/api/heldout")]);
    drawTable(peers.peers, peers.server_time);
    drawCharts(history.series);
    drawHeldout(history.series, heldout.nodes);
    drawLedger(ledger);
    const when = new Date().toLocaleTimeString();
    status.className = peers.last_error ? "error" : "muted";
    status.textContent = `${peers.peers.length} peers · updated ${when}` +
      (peers.last_error ? ` · swarm read failed: ${peers.last_error}` : "");
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (e) {
    status.className = "error";
    status.textContent = `dashboard API unreachable: ${e.message}`;
  }
}

buildCharts();
refresh();
setInterval(refresh, POLL_MS);
