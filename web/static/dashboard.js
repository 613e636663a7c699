// The dashboard at GET /dashboard: reads GET /dashboard/state every EVERY_MS while open, keeps the
// last HISTORY_MS of readings here, and draws one panel per model. Rates and quantiles come from two
// readings RATE_WINDOW_MS apart (the state holds running totals, as Prometheus counters do).
"use strict";

const EVERY_MS = 2000;
const HISTORY_MS = 5 * 60 * 1000;
const RATE_WINDOW_MS = 10 * 1000;
const MIN_SPAN_S = 60;  // the charts' time axis: the history kept, at least this long
const readings = [];  // {time, models: {name: figures}}, oldest first
let apiKey = sessionStorage.getItem("funnel-api-key") || "";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  node.append(...children.filter(c => c !== null && c !== undefined));
  return node;
}

const sum = values => values.reduce((a, b) => a + b, 0);

// One model's figures from a reading: levels as they are, running totals to be differenced later.
function figures(model) {
  const versions = model.versions;
  const status = model.requests.status;
  const workers = versions.flatMap(v => v.workers);
  return {
    queue: sum(versions.map(v => v.queue)), bulk: sum(versions.map(v => v.bulk)),
    inflight: sum(versions.map(v => v.inflight)), workers: workers.length, dead: model.dead,
    answers: sum(Object.values(status)), shed: status["503"] || 0,
    expired: (status["504"] || 0) + sum(workers.map(w => w.expired)),
    latency: model.requests.latency,
    cached: versions.some(v => v.cache), hits: sum(versions.map(v => v.cache?.hit || 0)),
    items: sum(versions.map(v => sum(Object.values(v.cache || {})))),
  };
}

// A cached version's hit rate and its items by outcome, this host's web processes since they started.
function cacheCell(counts) {
  if (!counts) return el("td", {}, "off");
  const hit = counts.hit || 0, miss = counts.miss || 0, coalesced = counts.coalesced || 0;
  const all = hit + miss + coalesced;
  return el("td", {"data-cache": "", title: "hits · misses · coalesced"},
    el("span", {"data-metric": "hit-rate"}, all ? `${(100 * hit / all).toFixed(1)}%` : "–"),
    ` (${hit} · ${miss} · ${coalesced})`);
}

// The q-quantile of the answers between two cumulative histograms, interpolated within its bucket
// (as Prometheus' histogram_quantile); null when nothing was answered between them.
function quantile(q, now, before) {
  const bounds = Object.keys(now).map(le => [le === "+Inf" ? Infinity : parseFloat(le), le])
    .sort((a, b) => a[0] - b[0]);
  const counts = bounds.map(([, le]) => (now[le] || 0) - ((before || {})[le] || 0));
  const total = counts[counts.length - 1];
  if (!total) return null;
  const rank = q * total;
  for (let i = 0; i < bounds.length; i++) {
    if (counts[i] >= rank) {
      const low = i ? bounds[i - 1][0] : 0, below = i ? counts[i - 1] : 0;
      if (bounds[i][0] === Infinity) return low;
      return low + (bounds[i][0] - low) * (rank - below) / Math.max(counts[i] - below, 1e-9);
    }
  }
  return null;
}

// Per reading and model, the series the charts draw: levels, and rates over the window before it.
function series(name) {
  return readings.map((reading, i) => {
    const now = reading.models[name];
    if (!now) return null;
    let j = i;
    while (j > 0 && reading.time - readings[j - 1].time <= RATE_WINDOW_MS / 1000) j--;
    const then = j < i ? readings[j].models[name] : null;
    const seconds = j < i ? reading.time - readings[j].time : 0;
    const rate = key => (then && seconds > 0 ? Math.max(0, now[key] - then[key]) / seconds : null);
    return {
      time: reading.time, queue: now.queue + now.bulk, inflight: now.inflight, workers: now.workers,
      rps: rate("answers"), shed: rate("shed"), expired: rate("expired"),
      hitRate: then && now.items > then.items ? 100 * (now.hits - then.hits) / (now.items - then.items) : null,
      p50: then ? quantile(0.5, now.latency, then.latency) : null,
      p99: then ? quantile(0.99, now.latency, then.latency) : null,
    };
  }).filter(Boolean);
}

function sparkline(points, keys, start, span) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${span} 100`);
  svg.setAttribute("preserveAspectRatio", "none");
  const top = Math.max(1e-9, ...points.flatMap(p => keys.map(k => p[k] ?? 0)));
  keys.forEach((key, n) => {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", points.filter(p => p[key] !== null)
      .map(p => `${(p.time - start).toFixed(1)},${(98 - 96 * p[key] / top).toFixed(1)}`).join(" "));
    if (n) line.setAttribute("class", "second");
    svg.append(line);
  });
  return svg;
}

const fixed = (value, digits = 1) => (value === null || value === undefined ? "–" : value.toFixed(digits));
const milliseconds = seconds => (seconds === null ? "–" : `${Math.round(seconds * 1000)} ms`);

function chart(metric, label, shown, points, keys, axis) {
  return el("div", {class: "chart", "data-chart": metric},
    el("div", {class: "label"}, label), el("div", {class: "value", "data-metric": metric}, shown),
    sparkline(points, keys, ...axis));
}

function panel(model) {
  const points = series(model.name);
  const last = points[points.length - 1] || {};
  const newest = readings[readings.length - 1]?.time ?? 0, oldest = readings[0]?.time ?? 0;
  const span = Math.min(HISTORY_MS / 1000, Math.max(MIN_SPAN_S, newest - oldest));
  const axis = [newest - span, span];
  const versions = model.versions;
  const workers = versions.flatMap(v => v.workers.map(w => ({...w, version: v.version})));
  return el("section", {class: "panel", "data-model": model.name},
    el("h2", {}, model.name, " ", el("small", {}, versions.map(v => `v${v.version}` +
      (v.weight !== null && v.weight !== undefined ? ` ${v.weight}%` : "")).join(" · "))),
    el("div", {class: "charts"},
      chart("queue", "queued (bulk incl.)", String(last.queue ?? 0), points, ["queue"], axis),
      chart("inflight", "in flight", String(last.inflight ?? 0), points, ["inflight"], axis),
      chart("workers", "live workers", String(last.workers ?? 0), points, ["workers"], axis),
      chart("rps", "answers / s", fixed(last.rps), points, ["rps"], axis),
      chart("latency", "p50 · p99", `${milliseconds(last.p50 ?? null)} · ${milliseconds(last.p99 ?? null)}`,
            points, ["p50", "p99"], axis),
      chart("shed", "shed · expired / s", `${fixed(last.shed, 2)} · ${fixed(last.expired, 2)}`,
            points, ["shed", "expired"], axis),
      readings[readings.length - 1]?.models[model.name]?.cached
        ? chart("cache", "cache hits %", fixed(last.hitRate), points, ["hitRate"], axis) : null),
    el("table", {class: "versions"},
      el("thead", {}, el("tr", {}, ...["version", "queue", "bulk", "in flight", "weight", "workers",
                                       "cache hit rate (hits · misses · coalesced)"].map(h => el("th", {}, h)))),
      el("tbody", {}, ...versions.map(v => el("tr", {"data-version": String(v.version)},
        ...[v.version, v.queue, v.bulk, v.inflight, v.weight ?? "–", v.workers.length]
          .map(x => el("td", {}, String(x))), cacheCell(v.cache))))),
    el("p", {class: "muted"}, `dead letters: ${model.dead}`),
    workers.length ? el("table", {class: "workers"},
      el("thead", {}, el("tr", {}, ...["worker", "version", "device", "backend", "batch", "heartbeat",
                                       "batches", "items", "state", "loads", "evictions"].map(h => el("th", {}, h)))),
      el("tbody", {}, ...workers.map(w => el("tr", {"data-worker": w.id, "data-state": w.state},
        ...[w.id, w.version, w.device, w.backend, w.batch_size, `${w.seen_s} s ago`, w.batches, w.items,
            w.state + (w.load_error ? `: ${w.load_error}` : ""), w.loads, w.evictions]
          .map(x => el("td", {}, String(x)))))))
      : el("p", {class: "none", "data-no-workers": ""}, "No live worker."));
}

function jobs(list) {
  const table = document.getElementById("jobs");
  document.getElementById("no-jobs").hidden = list.length > 0;
  table.hidden = list.length === 0;
  table.tBodies[0].replaceChildren(...list.map(job => el("tr", {"data-job": job.id},
    el("td", {}, el("code", {}, job.id)), el("td", {}, `${job.model} v${job.model_version}`),
    el("td", {}, job.owner || "–"), el("td", {}, job.state),
    el("td", {}, el("progress", {max: String(job.progress.total), value: String(job.progress.done)}),
       ` ${job.progress.done} / ${job.progress.total}` + (job.progress.failed ? ` (${job.progress.failed} failed)` : "")))));
}

function draw(state) {
  readings.push({time: state.time, models: Object.fromEntries(state.models.map(m => [m.name, figures(m)]))});
  while (readings.length && state.time - readings[0].time > HISTORY_MS / 1000) readings.shift();
  document.getElementById("models").replaceChildren(...state.models.map(panel));
  jobs(state.jobs);
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const answer = await fetch("/dashboard/state", {headers: apiKey ? {Authorization: `Bearer ${apiKey}`} : {}});
    if (answer.status === 401) {
      document.getElementById("key").hidden = false;
      status.textContent = "an API key is needed";
      return;
    }
    const body = await answer.json();
    if (!answer.ok) throw new Error(body.error?.message || `HTTP ${answer.status}`);
    draw(body);
    status.textContent = `updated ${new Date(body.time * 1000).toLocaleTimeString()}`;
    status.dataset.readings = String(readings.length);
  } catch (error) {
    status.textContent = `not updated: ${error.message}`;
  } finally {
    setTimeout(poll, EVERY_MS);
  }
}

document.getElementById("every").textContent = String(EVERY_MS / 1000);
document.getElementById("key").addEventListener("submit", event => {
  event.preventDefault();
  apiKey = event.target.elements.key.value.trim();
  sessionStorage.setItem("funnel-api-key", apiKey);
  event.target.hidden = true;
});
poll();
