// reverie play: sends the held keys (or "let the policy act") to the server and draws its snapshot.
// One request at a time: key presses queue up (auto-repeats are dropped while a step is in flight).
"use strict";

const $ = (id) => document.getElementById(id);
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
const TABLE_ROWS = 20;
const WATCH_MS = 120;

let keymap = null;
let modes = {};
const held = [];
const queue = [];
let busy = false;

async function call(path, body) {
  const response = await fetch(path, body === undefined ? {} :
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const data = await response.json();
  if (!response.ok) {
    $("status").textContent = data.detail || response.statusText;
    return null;
  }
  $("status").textContent = "";
  show(data);
  return data;
}

async function pump() {
  if (busy || queue.length === 0) return;
  busy = true;
  const [path, body] = queue.shift();
  try { await call(path, body); } finally { busy = false; pump(); }
}

function send(path, body) { queue.push([path, body]); pump(); }

document.addEventListener("keydown", (event) => {
  if (!keymap || !keymap.keys.includes(event.key) || event.target.tagName === "SELECT") return;
  event.preventDefault();
  if (!held.includes(event.key)) held.push(event.key);
  if (modes.driver !== "person" || (event.repeat && busy)) return;
  send("/api/step", {keys: [...held]});
});
document.addEventListener("keyup", (event) => {
  const i = held.indexOf(event.key);
  if (i >= 0) held.splice(i, 1);
});
window.addEventListener("blur", () => { held.length = 0; });

$("reset").onclick = () => send("/api/reset", {});
$("restart-dream").onclick = () => send("/api/dream", {});
$("driver").onchange = (e) => { e.target.blur(); send("/api/mode", {driver: e.target.value}); };
$("dream-start").onchange = (e) => { e.target.blur(); send("/api/mode", {dream_start: e.target.value}); };

// watch mode: the policy steps while nothing else is queued; a finished episode restarts after a pause
let lastDone = 0;
setInterval(() => {
  if (modes.driver !== "policy" || busy || queue.length) return;
  if ($("real-done").hidden) { send("/api/step", {policy: true}); return; }
  if (!lastDone) lastDone = Date.now();
  if (Date.now() - lastDone > 1500) { lastDone = 0; send("/api/reset", {}); }
}, WATCH_MS);

function fmt(x, digits = 3) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }

function images(container, frames) {
  container.replaceChildren(...frames.map(([caption, src]) => {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.src = src;
    img.alt = caption;
    const cap = document.createElement("figcaption");
    cap.textContent = caption;
    figure.append(img, cap);
    return figure;
  }));
}

function plot(title, series) {
  // series: [{values: [numbers], color, dashed, label}], x = index in the history
  const canvas = document.createElement("canvas");
  canvas.width = 300; canvas.height = 120;
  const ctx = canvas.getContext("2d");
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && isFinite(v));
  const lo = all.length ? Math.min(...all) : 0, hi = all.length ? Math.max(...all) : 1;
  const span = hi - lo || 1, n = Math.max(2, ...series.map((s) => s.values.length));
  const x = (i) => 30 + (i / (n - 1)) * (canvas.width - 40);
  const y = (v) => canvas.height - 15 - ((v - lo) / span) * (canvas.height - 30);
  ctx.font = "10px sans-serif"; ctx.fillStyle = "#555";
  ctx.fillText(hi.toPrecision(3), 0, 12); ctx.fillText(lo.toPrecision(3), 0, canvas.height - 5);
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.setLineDash(s.dashed ? [4, 3] : []); ctx.beginPath();
    s.values.forEach((v, i) => { if (v !== null) (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))); });
    ctx.stroke();
  }
  const figure = document.createElement("figure");
  const cap = document.createElement("figcaption");
  cap.textContent = title;
  figure.append(canvas, cap);
  return figure;
}

function show(s) {
  keymap = s.keymap; modes = s.modes;
  $("driver").value = modes.driver; $("dream-start").value = modes.dream_start;
  $("keys").tBodies[0].replaceChildren(...keymap.help.map(([keys, what]) => {
    const row = document.createElement("tr");
    row.innerHTML = "<td></td><td></td>";
    row.cells[0].textContent = keys; row.cells[1].textContent = what;
    return row;
  }));
  $("real-step").textContent = s.real.step;
  $("real-reward").textContent = fmt(s.real.reward);
  $("real-return").textContent = fmt(s.real.return);
  $("real-done").hidden = !s.real.done;
  $("dream-step").textContent = s.dream.step;
  $("dream-reward").textContent = fmt(s.dream.reward);
  $("dream-reward").dataset.value = s.dream.reward;
  $("dream-cont").textContent = fmt(s.dream.cont);
  $("dream-return").textContent = fmt(s.dream.return);
  const real = Object.entries(s.real.images).map(([k, src]) => [`observation ${k}`, src]);
  if (s.real.frame) real.unshift(["env render", s.real.frame]);
  images($("real-images"), real);
  images($("dream-images"), Object.entries(s.dream.images).map(([k, src]) => [`decoded ${k}`, src]));
  $("dream-nodecoder").hidden = s.decoded;
  $("dream-objective").textContent = s.representation;

  const h = s.history;
  const figures = [];
  const current = [];
  for (const key of s.vector_keys) {
    const dims = h.real_obs.length ? h.real_obs[0][key].length : 0;
    for (let d = 0; d < Math.min(dims, COLORS.length); d++) {
      figures.push(plot(`${key}[${d}]: true (solid) vs dreamed (dashed)`,
        [{values: h.real_obs.map((o) => o[key][d]), color: COLORS[d]},
         {values: h.dream_obs.map((o) => o[key][d]), color: COLORS[d], dashed: true}]));
      const last = h.real_obs.length - 1;
      current.push([`${key}[${d}]`, fmt(h.real_obs[last][key][d]), fmt(h.dream_obs[last][key][d])]);
    }
  }
  $("dream-vector").hidden = current.length === 0;
  $("dream-vector").tBodies[0].replaceChildren(...current.map((cells) => {
    const row = document.createElement("tr");
    for (const text of cells) { const cell = document.createElement("td"); cell.textContent = text; row.append(cell); }
    return row;
  }));
  figures.push(plot("reward: true (solid) vs predicted (dashed)",
    [{values: h.true_reward, color: "#000"}, {values: h.pred_reward, color: "#d62728", dashed: true}]));
  if (h.cont.length && h.cont[0] !== null) figures.push(plot("continue probability", [{values: h.cont, color: "#1f77b4"}]));
  if (h.latent.length) figures.push(plot("latent agreement: cos(dream, real posterior) features",
    [{values: h.latent, color: "#2ca02c"}]));
  $("plots").replaceChildren(...figures);

  const rows = [];
  for (let i = h.step.length - 1; i >= Math.max(0, h.step.length - TABLE_ROWS); i--) {
    const row = document.createElement("tr");
    row.dataset.step = h.step[i];
    for (const [value, text] of [[h.step[i], h.step[i]], [h.action[i], h.action[i]],
                                 [h.true_reward[i], fmt(h.true_reward[i])], [h.pred_reward[i], fmt(h.pred_reward[i])],
                                 [h.cont[i], fmt(h.cont[i])]]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      cell.dataset.value = value;
      row.append(cell);
    }
    rows.push(row);
  }
  $("steps").tBodies[0].replaceChildren(...rows);
  document.body.dataset.ready = "1";
}

call("/api/state");
