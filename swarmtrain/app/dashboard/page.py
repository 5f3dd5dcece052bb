"""The dashboard's single web page: inline CSS, vanilla JavaScript, SVG charts drawn in the browser.

No external URL of any kind (fonts, scripts, images), so it works offline and leaks nothing. The
script fetches ``/api/state`` every 2 s and redraws. Everything that comes from peers (IDs, regions,
versions, ban reasons) is written with ``textContent``, never parsed as HTML.

Stable element IDs for tests and scripts: ``#status``, ``#peers`` (a table; each row has
``data-peer`` = the full peer ID), ``#loss-curve`` (an SVG with ``data-points`` = the number of loss
points drawn), ``#loss-points`` (``data-count``, the same number), ``#throughput``,
``#bytes-per-round``, ``#timeline``, ``#bans``, ``#cards``, ``#contributions`` (a table, one row per
volunteer seen, gone ones too, each with ``data-peer``, ``data-tokens`` and ``data-rounds``).
"""

from __future__ import annotations

__all__ = ["PAGE", "REFRESH_MS"]

REFRESH_MS = 2000

_CSS = r"""
:root { --bg:#f5f6f8; --card:#fff; --ink:#1d2433; --mute:#6b7385; --line:#e3e6ec; --grid:#eef0f4;
  --ok:#2f9e62; --late:#e3a21a; --fail:#d64545; --sent:#3b6fd8; --recv:#9a6bd8; }
* { box-sizing:border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif; }
header { display:flex; align-items:baseline; gap:14px; padding:12px 22px; background:#1d2433; color:#fff; }
header h1 { font-size:17px; margin:0; font-weight:600; letter-spacing:.2px; }
header .run { font-family:ui-monospace,"DejaVu Sans Mono",monospace; color:#c9d3ea; }
#status { margin-left:auto; font-size:12px; color:#c9d3ea; }
#status.err { color:#ffb4b4; }
.dot { display:inline-block; width:8px; height:8px; border-radius:50%; background:var(--ok);
  margin-right:6px; }
#status.err .dot { background:var(--fail); }
main { padding:14px 22px 24px; max-width:1400px; margin:0 auto; }
#cards { display:grid; grid-template-columns:repeat(6,1fr); gap:12px; margin-bottom:12px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:9px 13px; }
.card .k { color:var(--mute); font-size:11px; text-transform:uppercase; letter-spacing:.5px; }
.card .v { font-size:20px; white-space:nowrap; font-weight:600; margin-top:1px;
  font-variant-numeric:tabular-nums; }
.card .v small { font-size:12px; font-weight:400; color:var(--mute); }
.grid { display:grid; grid-template-columns:3fr 2fr; gap:12px; margin-bottom:12px; }
.panel { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:9px 13px 6px; }
.panel h2 { font-size:12px; margin:0 0 2px; color:var(--mute); font-weight:600; text-transform:uppercase;
  letter-spacing:.5px; display:flex; gap:10px; align-items:baseline; }
.panel h2 .aside { margin-left:auto; text-transform:none; letter-spacing:0; font-weight:400; }
svg.chart { width:100%; height:auto; display:block; }
svg text { font-size:11px; fill:var(--mute); }
svg .axis { stroke:#b9bfcc; stroke-width:1; }
svg .gridline { stroke:var(--grid); stroke-width:1; }
svg .label { fill:var(--ink); font-size:11px; }
svg .empty { font-size:13px; fill:#9aa1b1; }
.legend { display:flex; flex-wrap:wrap; gap:4px 14px; font-size:11px; color:var(--mute); min-height:16px; }
.legend i { display:inline-block; width:14px; height:3px; border-radius:2px; vertical-align:middle;
  margin-right:5px; }
table { width:100%; border-collapse:collapse; font-variant-numeric:tabular-nums; }
th { text-align:right; color:var(--mute); font-weight:600; font-size:11px; text-transform:uppercase;
  letter-spacing:.4px; padding:5px 7px; border-bottom:1px solid var(--line); white-space:nowrap; }
td { text-align:right; padding:5px 7px; border-bottom:1px solid var(--grid); white-space:nowrap; }
th.l, td.l { text-align:left; }
td.id { font-family:ui-monospace,"DejaVu Sans Mono",monospace; }
td.id i { display:inline-block; width:9px; height:9px; border-radius:50%; margin-right:6px; }
.badge { display:inline-block; padding:0 7px; border-radius:9px; font-size:11px; color:#fff; }
.b-committed { background:var(--ok); }
.b-late { background:var(--late); }
.b-failed { background:var(--fail); }
.banned { color:var(--fail); font-weight:600; }
.muted { color:var(--mute); }
#bans li { margin:3px 0; } #bans ul { margin:4px 0 6px; padding-left:18px; }
.mono { font-family:ui-monospace,"DejaVu Sans Mono",monospace; }
"""

_BODY = r"""
<header><h1>swarmtrain dashboard</h1><span class="run" id="run">run …</span>
<span id="status"><span class="dot"></span>connecting…</span></header>
<main>
<section id="cards">
 <div class="card"><div class="k">live peers</div><div class="v" id="c-peers">–</div></div>
 <div class="card"><div class="k">throughput</div><div class="v" id="c-tps">–</div></div>
 <div class="card"><div class="k">round</div><div class="v" id="c-round">–</div></div>
 <div class="card"><div class="k">round outcomes</div><div class="v" id="c-outcomes">–</div></div>
 <div class="card"><div class="k">traffic up / down</div><div class="v" id="c-traffic">–</div></div>
 <div class="card"><div class="k">banned peers</div><div class="v" id="c-bans">–</div></div>
</section>
<div class="grid">
 <div class="panel"><h2>loss curve<span class="aside" id="loss-points" data-count="0">0 points</span></h2>
  <svg class="chart" id="loss-curve" data-points="0" viewBox="0 0 640 230"></svg>
  <div class="legend" id="loss-legend"></div></div>
 <div class="panel"><h2>throughput (all peers)</h2>
  <svg class="chart" id="throughput" viewBox="0 0 420 230"></svg>
  <div class="legend"><span><i style="background:var(--sent)"></i>tokens/s, summed over the live peers</span>
  </div></div>
</div>
<div class="grid">
 <div class="panel"><h2>bytes per round</h2>
  <svg class="chart" id="bytes-per-round" viewBox="0 0 640 200"></svg>
  <div class="legend"><span><i style="background:var(--sent)"></i>sent</span>
   <span><i style="background:var(--recv)"></i>received</span>
   <span>(all peers' ledgers, per round)</span></div></div>
 <div class="panel"><h2>round timeline</h2>
  <svg class="chart" id="timeline" viewBox="0 0 420 200"></svg>
  <div class="legend"><span><i style="background:var(--ok)"></i>committed</span>
   <span><i style="background:var(--late)"></i>late</span>
   <span><i style="background:var(--fail)"></i>failed</span></div></div>
</div>
<div class="panel" style="margin-bottom:12px"><h2>peers</h2>
<table id="peers"><thead><tr><th class="l">peer</th><th class="l">role</th><th class="l">region</th>
<th>step</th>
<th>round</th><th>loss</th><th>tok/s</th><th>up</th><th>down</th><th class="l">version</th><th>committed</th>
<th>late</th><th>failed</th><th class="l">last round</th><th class="l">banned</th><th>seen</th></tr></thead>
<tbody><tr><td class="l muted" colspan="16">waiting for the first poll…</td></tr></tbody></table></div>
<div class="panel" style="margin-bottom:12px"><h2>contributions<span class="aside">tokens of each
volunteer's own steps in the rounds it committed, as its record claims them; restarts summed</span></h2>
<table id="contributions"><thead><tr><th class="l">volunteer</th><th class="l">state</th><th>tokens</th>
<th>share</th><th>rounds committed</th><th>first seen</th><th>last seen</th></tr></thead>
<tbody><tr><td class="l muted" colspan="7">waiting for the first poll…</td></tr></tbody></table></div>
<div class="panel"><h2>bans</h2><div id="bans"><p class="muted">none</p></div></div>
</main>
"""

_JS = r"""
const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b6fd8", "#e4572e", "#2f9e62", "#9a6bd8", "#e3a21a", "#17a2b8", "#c2477e", "#6b8e23",
                 "#8d6e63", "#5c6bc0"];
const OUT_COLOR = {committed:"var(--ok)", late:"var(--late)", failed:"var(--fail)"};
const colorOf = {};
function color(id) {
  if (!(id in colorOf)) colorOf[id] = PALETTE[Object.keys(colorOf).length % PALETTE.length];
  return colorOf[id];
}
function $(id) { return document.getElementById(id); }
function h(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function s(parent, tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}
function short(id) { return id.length > 12 ? "…" + id.slice(-12) : id; }
function bytes(n) {
  const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 1 : 0) : n.toFixed(0)) + " " + u[i];
}
function num(n) {
  const a = Math.abs(n);
  if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e3) return (n / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
  if (a >= 10 || Number.isInteger(n)) return n.toFixed(0);
  return n.toPrecision(2);
}
function ago(sec) {
  return sec == null ? "–" : sec < 90 ? sec.toFixed(0) + " s" : (sec / 60).toFixed(0) + " min";
}
function ticks(lo, hi, n) {
  if (!(hi > lo)) { hi = lo + 1; }
  const raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  const step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}
// A frame with gridlines, tick labels and axis titles; returns x/y mappers into the plot box.
function frame(svg, W, H, xr, yr, o) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const L = o.left || 52, R = 12, T = 10, B = 38, pw = W - L - R, ph = H - T - B;
  const xt = o.xticks || ticks(xr[0], xr[1], 6), yt = ticks(yr[0], yr[1], 4);
  const x0 = Math.min(xr[0], xt[0] ?? xr[0]), x1 = Math.max(xr[1], xt[xt.length - 1] ?? xr[1]);
  const y0 = Math.min(yr[0], yt[0]), y1 = Math.max(yr[1], yt[yt.length - 1]);
  const X = v => L + (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5) * pw;
  const Y = v => T + ph - (y1 > y0 ? (v - y0) / (y1 - y0) : 0.5) * ph;
  for (const v of yt) {
    s(svg, "line", {class:"gridline", x1:L, x2:L + pw, y1:Y(v), y2:Y(v)});
    s(svg, "text", {x:L - 6, y:Y(v) + 4, "text-anchor":"end"}, o.yfmt(v));
  }
  for (const v of xt) s(svg, "text", {x:X(v), y:T + ph + 14, "text-anchor":"middle"}, o.xfmt(v));
  s(svg, "line", {class:"axis", x1:L, x2:L + pw, y1:T + ph, y2:T + ph});
  s(svg, "line", {class:"axis", x1:L, x2:L, y1:T, y2:T + ph});
  s(svg, "text", {class:"label", x:L + pw / 2, y:H - 4, "text-anchor":"middle"}, o.xlabel);
  s(svg, "text", {class:"label", x:12, y:T + ph / 2, "text-anchor":"middle",
                  transform:`rotate(-90 12 ${T + ph / 2})`}, o.ylabel);
  return {X, Y, L, T, pw, ph, x0, x1};
}
function empty(svg, W, H, msg) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  s(svg, "text", {class:"empty", x:W / 2, y:H / 2, "text-anchor":"middle"}, msg);
}
function range(vals) { return [Math.min(...vals), Math.max(...vals)]; }

function drawLoss(st) {
  const svg = $("loss-curve"), W = 640, H = 230, legend = $("loss-legend");
  const lines = [];
  for (const [id, ser] of Object.entries(st.series)) {
    const pts = ser.points.filter(p => p[3] !== null).map(p => [p[1], p[3]]);
    if (pts.length) lines.push([id, ser.live, pts]);
  }
  const count = lines.reduce((a, l) => a + l[2].length, 0);
  svg.setAttribute("data-points", count);
  $("loss-points").setAttribute("data-count", count);
  $("loss-points").textContent = count + (count === 1 ? " point" : " points");
  legend.textContent = "";
  if (!count) { empty(svg, W, H, "no loss reported yet"); return; }
  const all = lines.flatMap(l => l[2]);
  let yr = range(all.map(p => p[1])); const pad = (yr[1] - yr[0]) * 0.08 || Math.abs(yr[0]) * 0.05 || 0.1;
  yr = [yr[0] - pad, yr[1] + pad];
  const f = frame(svg, W, H, range(all.map(p => p[0])), yr,
                  {xlabel:"step", ylabel:"training loss", xfmt:num, yfmt:v => v.toFixed(2),
                   xticks:st.step_ticks && st.step_ticks.length ? st.step_ticks : undefined});
  for (const [id, live, pts] of lines) {
    const c = color(id);
    const xy = pts.map(p => f.X(p[0]).toFixed(1) + "," + f.Y(p[1]).toFixed(1)).join(" ");
    const pl = s(svg, "polyline", {points:xy,
      fill:"none", stroke:c, "stroke-width":2, "stroke-linejoin":"round", "data-peer":id, class:"series",
      "stroke-dasharray":live ? "" : "4 3", opacity:live ? 1 : 0.6});
    s(pl, "title", {}, id);
    const last = pts[pts.length - 1];
    s(svg, "circle", {cx:f.X(last[0]), cy:f.Y(last[1]), r:3, fill:c});
    const item = h("span", {"data-peer":id}); item.appendChild(h("i", {style:"background:" + c}));
    item.appendChild(document.createTextNode(short(id) + (live ? "" : " (left)")));
    legend.appendChild(item);
  }
}
function drawThroughput(st) {
  const svg = $("throughput"), W = 420, H = 230, pts = st.throughput.map(p => [p[0] - st.now, p[1]]);
  if (pts.length < 2) { empty(svg, W, H, "waiting for two polls"); return; }
  const xr = range(pts.map(p => p[0])), ymax = Math.max(...pts.map(p => p[1]));
  const f = frame(svg, W, H, xr, [0, ymax > 0 ? ymax * 1.1 : 1],
                  {xlabel:"seconds ago", ylabel:"tokens / s", xfmt:v => num(-v), yfmt:num});
  const d = pts.map(p => f.X(p[0]).toFixed(1) + "," + f.Y(p[1]).toFixed(1));
  const area = [f.X(pts[0][0]) + "," + f.Y(0), ...d, f.X(pts[pts.length - 1][0]) + "," + f.Y(0)];
  s(svg, "polygon", {points:area.join(" "), fill:"var(--sent)", opacity:0.12});
  s(svg, "polyline", {points:d.join(" "), fill:"none", stroke:"var(--sent)", "stroke-width":2});
}
function drawBytes(st) {
  const svg = $("bytes-per-round"), W = 640, H = 200, rows = st.rounds.slice(-40);
  if (!rows.length) { empty(svg, W, H, "no traffic counted yet"); return; }
  const r0 = rows[0].round, r1 = rows[rows.length - 1].round, n = r1 - r0 + 1;
  const top = Math.max(...rows.map(r => r.bytes_sent + r.bytes_received));
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  const k = Math.max(0, Math.min(units.length - 1, Math.floor(Math.log(Math.max(top, 1)) / Math.log(1024))));
  const u = Math.pow(1024, k), ymax = top / u;
  const xt = ticks(r0, r1, Math.min(8, n)).filter(v => Number.isInteger(v));
  const f = frame(svg, W, H, [r0 - 0.5, Math.max(r1, r0 + 11) + 0.5], [0, ymax * 1.1 || 1],
                  {xlabel:"round", ylabel:units[k], xfmt:v => v, yfmt:num, xticks:xt});
  const bw = Math.max(2, f.pw / (f.x1 - f.x0) * 0.7);
  for (const r of rows) {
    const x = f.X(r.round) - bw / 2, ys = f.Y(r.bytes_sent / u);
    const yr = f.Y((r.bytes_sent + r.bytes_received) / u);
    const g = s(svg, "g", {"data-round":r.round});
    s(g, "title", {}, `round ${r.round}: sent ${bytes(r.bytes_sent)}, received ${bytes(r.bytes_received)}`);
    s(g, "rect", {x, y:ys, width:bw, height:f.Y(0) - ys, fill:"var(--sent)"});
    s(g, "rect", {x, y:yr, width:bw, height:ys - yr, fill:"var(--recv)"});
  }
}
function drawTimeline(st) {
  const svg = $("timeline"), W = 420, H = 200, ev = st.timeline;
  if (!ev.length) { empty(svg, W, H, "no round finished yet"); return; }
  const rmax = Math.max(...ev.map(e => e.round));
  const rmin = Math.max(Math.min(...ev.map(e => e.round)), rmax - 29);
  const shown = ev.filter(e => e.round >= rmin);
  const peers = [...new Set(shown.map(e => e.peer))].sort().slice(0, 8);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const L = 96, R = 10, T = 8, B = 38, pw = W - L - R, ph = H - T - B, n = Math.max(rmax - rmin + 1, 12);
  const cw = pw / n, rh = Math.min(34, ph / peers.length);
  peers.forEach((p, i) => {
    s(svg, "text", {x:L - 8, y:T + rh * (i + 0.5) + 4, "text-anchor":"end", class:"mono"}, short(p));
    s(svg, "line", {class:"gridline", x1:L, x2:L + pw, y1:T + rh * (i + 1), y2:T + rh * (i + 1)});
  });
  for (const e of shown) {
    const i = peers.indexOf(e.peer); if (i < 0) continue;
    const r = s(svg, "rect", {x:L + (e.round - rmin) * cw + 1, y:T + rh * i + 3, width:Math.max(cw - 2, 1),
      height:rh - 6, rx:2, fill:OUT_COLOR[e.outcome], "data-outcome":e.outcome});
    const many = e.n > 1 ? ` (${e.n} rounds)` : "";
    s(r, "title", {}, `${short(e.peer)} round ${e.round}: ${e.outcome}${many}`);
  }
  const yb = T + rh * peers.length;
  s(svg, "line", {class:"axis", x1:L, x2:L + pw, y1:yb, y2:yb});
  for (const v of ticks(rmin, rmax, Math.min(6, n)).filter(v => Number.isInteger(v)))
    s(svg, "text", {x:L + (v - rmin + 0.5) * cw, y:yb + 14, "text-anchor":"middle"}, v);
  s(svg, "text", {class:"label", x:L + pw / 2, y:Math.min(yb + 32, H - 4), "text-anchor":"middle"}, "round");
}
function cell(tr, text, cls, title) {
  const td = h("td", cls ? {class:cls} : {}, text);
  if (title) td.title = title;
  tr.appendChild(td);
  return td;
}
function drawPeers(st) {
  const tb = $("peers").tBodies[0]; tb.textContent = "";
  if (!st.peers.length) {
    const tr = h("tr");
    const msg = st.polls ? "no live peer in this run" : "waiting for the first poll…";
    cell(tr, msg, "l muted").setAttribute("colspan", 16);
    tb.appendChild(tr);
    return;
  }
  for (const p of st.peers) {
    const tr = h("tr", {"data-peer":p.peer});
    const id = cell(tr, "", "l id", p.peer);
    const trains = p.role !== "bootstrap" && p.role !== "monitor";
    id.appendChild(h("i", {style:trains ? "background:" + color(p.peer) : "border:1px solid #b9bfcc"}));
    id.appendChild(document.createTextNode(short(p.peer)));
    cell(tr, p.role, "l"); cell(tr, p.region, "l"); cell(tr, p.step); cell(tr, p.round);
    cell(tr, p.loss === null ? "–" : p.loss.toFixed(4)); cell(tr, num(p.throughput));
    cell(tr, bytes(p.bytes_sent)); cell(tr, bytes(p.bytes_received)); cell(tr, p.version || "–", "l");
    cell(tr, p.committed); cell(tr, p.late); cell(tr, p.failed);
    const last = cell(tr, "", "l");
    if (p.outcome) last.appendChild(h("span", {class:"badge b-" + p.outcome}, p.outcome));
    cell(tr, p.banned ? "banned" : "no", p.banned ? "l banned" : "l muted", p.banned || "");
    cell(tr, ago(p.seen_ago));
    tb.appendChild(tr);
  }
}
function drawContributions(st) {
  const tb = $("contributions").tBodies[0]; tb.textContent = "";
  const rows = st.contributions || [];
  if (!rows.length) {
    const tr = h("tr");
    cell(tr, st.polls ? "no volunteer seen yet" : "waiting for the first poll…", "l muted")
      .setAttribute("colspan", 7);
    tb.appendChild(tr);
    return;
  }
  for (const c of rows) {
    const tr = h("tr", {"data-peer":c.peer, "data-tokens":c.tokens, "data-rounds":c.rounds});
    const id = cell(tr, "", "l id", c.peer);
    id.appendChild(h("i", {style:"background:" + color(c.peer)}));
    id.appendChild(document.createTextNode(short(c.peer)));
    cell(tr, c.live ? "live" : "left", c.live ? "l" : "l muted");
    cell(tr, num(c.tokens), "", c.tokens.toLocaleString());
    cell(tr, (100 * c.share).toFixed(1) + " %"); cell(tr, c.rounds);
    cell(tr, ago(st.now - c.first_seen)); cell(tr, c.live ? "now" : ago(st.now - c.last_seen));
    tb.appendChild(tr);
  }
}
function drawBans(st) {
  const box = $("bans"); box.textContent = "";
  if (!st.bans.length) {
    box.appendChild(h("p", {class:"muted"}, "none: no peer is banned by the run's suspicion records"));
    return;
  }
  const ul = h("ul");
  for (const b of st.bans) {
    const li = h("li", {"data-peer":b.peer}); li.appendChild(h("span", {class:"mono banned"}, short(b.peer)));
    li.appendChild(document.createTextNode(": " + b.reason)); ul.appendChild(li);
  }
  box.appendChild(ul);
}
function drawCards(st) {
  const workers = st.peers.filter(p => p.role !== "bootstrap" && p.role !== "monitor");
  $("c-peers").textContent = ""; $("c-peers").append(String(workers.length),
    h("small", {}, ` trainers · ${st.peers.length} in all`));
  const tps = workers.reduce((a, p) => a + p.throughput, 0);
  $("c-tps").textContent = ""; $("c-tps").append(num(tps), h("small", {}, " tok/s"));
  $("c-round").textContent = workers.length ? Math.max(...workers.map(p => p.round)) : "–";
  const oc = $("c-outcomes"); oc.textContent = "";
  for (const k of ["committed", "late", "failed"]) {
    if (oc.childNodes.length) oc.append(h("small", {}, " · "));
    oc.append(h("span", {style:"color:" + OUT_COLOR[k], title:k, "data-outcome":k}, String(st.totals[k])));
  }
  const up = st.peers.reduce((a, p) => a + p.bytes_sent, 0);
  const dn = st.peers.reduce((a, p) => a + p.bytes_received, 0);
  $("c-traffic").textContent = "";
  $("c-traffic").append(bytes(up), h("small", {}, " / "), bytes(dn));
  $("c-bans").textContent = st.bans.length;
  $("c-bans").style.color = st.bans.length ? "var(--fail)" : "";
}
function render(st) {
  $("run").textContent = "run " + st.run_id;
  document.title = `swarmtrain · ${st.run_id}`;
  const status = $("status"); status.textContent = ""; status.appendChild(h("span", {class:"dot"}));
  status.className = st.error ? "err" : "";
  status.append(st.error ? "DHT poll failed: " + st.error
    : `updated ${new Date(st.updated * 1000).toLocaleTimeString()} · ${st.polls} polls`);
  for (const f of [drawCards, drawPeers, drawLoss, drawThroughput, drawBytes, drawTimeline,
                   drawContributions, drawBans]) {
    try { f(st); } catch (e) { console.error(f.name, e); }
  }
}
async function tick() {
  try {
    const r = await fetch("api/state", {cache:"no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
  } catch (e) {
    const status = $("status"); status.className = "err";
    status.textContent = ""; status.append(h("span", {class:"dot"}), "dashboard unreachable: " + e.message);
  }
}
tick();
setInterval(tick, REFRESH_MS);
"""

PAGE = (
    '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
    '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
    "<title>swarmtrain dashboard</title>\n"
    f"<style>{_CSS}</style></head>\n<body>{_BODY}"
    f'<script>"use strict";\nconst REFRESH_MS = {REFRESH_MS};\n{_JS}</script>\n</body></html>\n'
)
