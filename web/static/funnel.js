// The page at GET /: pick a model, send an image or some sentences, show the answer.
// Plain browser JavaScript, no build step and no dependencies.
"use strict";

// What an error status means to a person; a few error codes say it better still.
const STATUS_TITLES = {
  400: "The input was rejected", 401: "An API key is needed", 404: "Unknown model",
  413: "File too large", 415: "Unsupported file type", 429: "Too many requests, try again",
  500: "The server failed", 502: "Server unreachable", 503: "Server busy, try again",
  504: "Timed out, try again",
};
const CODE_TITLES = {
  not_an_image: "Not an image", corrupt_image: "The image could not be decoded",
  image_too_large: "Image too large", empty_input: "Nothing to send", missing_file: "No file chosen",
  text_too_long: "Text too long", too_many_items: "Too many sentences",
};

const $ = (root, selector) => root.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter(c => c !== null && c !== undefined));
  return node;
}

function ms(value) {
  return value < 10 ? `${value.toFixed(1)} ms` : `${Math.round(value)} ms`;
}

function size(bytes) {
  if (bytes < 1024) return `${bytes} bytes`;
  return bytes < 1024 * 1024 ? `${Math.round(bytes / 1024)} KB` : `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

// One number, or "low–high" when several requests differ.
function span(values, format) {
  const low = Math.min(...values), high = Math.max(...values);
  return low === high ? format(low) : `${format(low)}–${format(high)}`;
}

function timings(roundTripMs, meta) {
  const metas = Array.isArray(meta) ? meta : [meta];
  const workers = [...new Set(metas.map(m => m.worker))];
  const items = [
    ["round trip", ms(roundTripMs)],
    ["queue", span(metas.map(m => m.queue_ms), ms)],
    ["inference", span(metas.map(m => m.infer_ms), ms)],
    ["batch size", span(metas.map(m => m.batch_size), String)],
    [workers.length > 1 ? "workers" : "worker", workers.join(", ")],
  ];
  return el("dl", {class: "timings"},
    ...items.map(([name, value]) => el("div", {}, el("dt", {}, name), el("dd", {}, value))));
}

function errorBox(title, detail) {
  return el("div", {class: "error", role: "alert"}, el("strong", {}, title),
            detail ? el("span", {}, detail) : null);
}

function setResult(panel, state, ...nodes) {
  panel.dataset.state = state;
  $(panel, ".result").replaceChildren(...nodes);
}

// POST to the panel's model; returns the JSON answer, or null after showing an error.
// A newer request on the same panel wins: the answer of an older one is dropped.
async function predict(panel, init) {
  const ticket = (panel._ticket = (panel._ticket || 0) + 1);
  const button = $(panel, "button[type=submit]");
  button.disabled = true;
  panel.setAttribute("aria-busy", "true");
  setResult(panel, "loading", el("p", {class: "muted"}, "Waiting for a worker…"));
  const started = performance.now();
  let response, body = null;
  try {
    response = await fetch(`/v1/models/${encodeURIComponent(panel.dataset.model)}/predict`,
                           {method: "POST", ...init});
    try { body = await response.json(); } catch { body = null; }
  } catch (err) {
    if (ticket === panel._ticket) {
      setResult(panel, "error", errorBox("Could not reach the server", "check that it is running, then try again"));
      done(panel, button);
    }
    return null;
  }
  const roundTripMs = performance.now() - started;
  if (ticket !== panel._ticket) return null;
  done(panel, button);
  if (!response.ok || !body || body.error) {
    const error = (body && body.error) || {};
    let title = CODE_TITLES[error.code] || STATUS_TITLES[response.status] || `Request failed`;
    const retry = response.headers.get("Retry-After");
    if (response.status === 503 && retry) title += ` in ${retry} s`;
    const detail = [error.message, `HTTP ${response.status}`].filter(Boolean).join(" · ");
    setResult(panel, "error", errorBox(title, detail));
    return null;
  }
  body.roundTripMs = roundTripMs;
  return body;
}

function done(panel, button) {
  panel.removeAttribute("aria-busy");
  button.disabled = false;
}

// -- images ------------------------------------------------------------------

function setupImage(panel) {
  const form = $(panel, ".image-form"), input = $(form, "input[type=file]");
  const drop = $(form, ".drop"), preview = $(form, ".preview"), button = $(form, "button");
  const fileLine = $(form, ".file");
  let file = null;
  // Whatever the browser cannot show (not an image at all) is named instead of drawn broken.
  preview.addEventListener("error", () => { preview.hidden = true; });

  function choose(chosen) {
    if (!chosen) return;
    file = chosen;
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.hidden = false;
    preview.src = URL.createObjectURL(file);
    fileLine.textContent = `${file.name} · ${size(file.size)}`;
    fileLine.hidden = false;
    drop.classList.add("has-image");
    $(drop, ".hint").innerHTML = "<b>Drop another image</b> or <u>choose a file</u>";
    button.disabled = false;
    classify();
  }

  async function classify() {
    if (!file) return;
    const data = new FormData();
    data.append("file", file, file.name);
    const body = await predict(panel, {body: data});
    if (!body) return;
    if (Array.isArray(body.lines)) {  // a reading of the page (the OCR chain): its lines boxed on it
      setResult(panel, "done", lines(preview.src, preview.naturalWidth, preview.naturalHeight, body.lines),
                timings(body.roundTripMs, body.meta));
      return;
    }
    if (!Array.isArray(body.predictions)) {  // an image model of another task: show its answer as is
      setResult(panel, "done", jsonView(body), timings(body.roundTripMs, body.meta));
      return;
    }
    const rows = body.predictions.map(p => el("li", {},
      el("span", {class: "label", title: `ImageNet class ${p.index}`}, p.label),
      el("span", {class: "pct"}, `${(p.probability * 100).toFixed(1)}%`),
      el("span", {class: "bar"}, el("span", {style: {width: `${(p.probability * 100).toFixed(1)}%`}}))));
    setResult(panel, "done", el("ol", {class: "top5"}, ...rows), timings(body.roundTripMs, body.meta));
  }

  input.addEventListener("change", () => choose(input.files[0]));
  form.addEventListener("submit", event => { event.preventDefault(); classify(); });
  for (const type of ["dragenter", "dragover"]) {
    drop.addEventListener(type, event => { event.preventDefault(); drop.classList.add("dragging"); });
  }
  for (const type of ["dragleave", "drop"]) {
    drop.addEventListener(type, () => drop.classList.remove("dragging"));
  }
  drop.addEventListener("drop", event => {
    event.preventDefault();
    choose(event.dataTransfer && event.dataTransfer.files[0]);
  });
}

// The page with each line's box drawn on it (an SVG over the image, in the image's own pixels), and
// the lines read, in order: a line answered with an error is boxed apart and names it.
function lines(src, width, height, found) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "boxes");
  found.forEach((line, i) => {
    const shape = document.createElementNS("http://www.w3.org/2000/svg", "polygon");
    shape.setAttribute("points", line.box.map(([x, y]) => `${x},${y}`).join(" "));
    shape.setAttribute("class", line.error ? "failed" : "read");
    const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
    title.textContent = `${i + 1}: ${line.error ? line.error.message : line.text}`;
    shape.append(title);
    svg.append(shape);
  });
  const page = el("div", {class: "page"}, el("img", {src, alt: "the page read"}), svg);
  const list = el("ol", {class: "lines"}, ...found.map(line => el("li", {},
    line.error ? el("span", {class: "failed"}, line.error.message) : el("span", {class: "text"}, line.text),
    line.error ? null : el("span", {class: "pct"}, `${(line.confidence * 100).toFixed(1)}%`))));
  return el("div", {class: "reading"}, page, found.length ? list : el("p", {}, "No text found."));
}

// -- text --------------------------------------------------------------------

function heat(value) {
  const v = Math.max(0, Math.min(1, value));
  return {background: `rgba(37, 99, 235, ${(0.08 + 0.82 * v).toFixed(3)})`, color: v > 0.55 ? "#fff" : ""};
}

function similarityView(texts, embeddings) {
  // Embeddings are L2-normalised: the cosine is the dot product.
  const dot = (a, b) => a.reduce((sum, x, k) => sum + x * b[k], 0);
  const sim = embeddings.map(a => embeddings.map(b => dot(a, b)));
  const n = texts.length;
  let best = null;
  for (let i = 0; i < n; i++) {
    for (let j = i + 1; j < n; j++) {
      if (!best || sim[i][j] > best.value) best = {i, j, value: sim[i][j]};
    }
  }
  const head = el("tr", {}, el("th", {}, ""),
    ...texts.map((t, j) => el("th", {scope: "col", title: t}, String(j + 1))));
  const rows = texts.map((t, i) => el("tr", {}, el("th", {scope: "row", title: t}, String(i + 1)),
    ...sim[i].map((value, j) => el("td", {
      "data-i": i, "data-j": j, "data-value": value.toFixed(4), class: i === j ? "self" : "",
      title: `${i + 1} · ${j + 1}: cosine ${value.toFixed(4)}`, style: i === j ? {} : heat(value),
    }, value.toFixed(2)))));
  return el("div", {class: "similarity"},
    el("ol", {class: "sentences"}, ...texts.map(t => el("li", {}, t))),
    el("div", {class: "matrix"},
      el("table", {}, el("caption", {}, "Cosine similarity"), el("thead", {}, head), el("tbody", {}, ...rows))),
    el("p", {class: "best"}, "Most alike: ", el("b", {}, `${best.i + 1} and ${best.j + 1}`),
       ` (${best.value.toFixed(2)})`));
}

// A form whose textarea holds one item a line: `send` gets its non-empty lines, trimmed;
// Ctrl+Enter (Cmd+Enter) submits it.
function onLines(panel, selector, what, send) {
  const form = $(panel, selector), textarea = $(form, "textarea");
  form.addEventListener("submit", async event => {
    event.preventDefault();
    const lines = textarea.value.split("\n").map(t => t.trim()).filter(Boolean);
    if (!lines.length) {
      setResult(panel, "error", errorBox("Nothing to send", `type ${what}, or several, one per line`));
      return;
    }
    await send(lines);
  });
  textarea.addEventListener("keydown", event => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
}

function setupText(panel) {
  onLines(panel, ".text-form", "a sentence", async texts => {
    const payload = texts.length === 1 ? {text: texts[0]} : {texts};
    const body = await predict(panel, {headers: {"Content-Type": "application/json"},
                                       body: JSON.stringify(payload)});
    if (!body) return;
    const results = texts.length === 1 ? [body] : body.results;
    if (!results.every(r => Array.isArray(r.embedding))) {  // a text model of another task
      setResult(panel, "done", jsonView(body), timings(body.roundTripMs, body.meta));
      return;
    }
    if (texts.length === 1) {
      const head = body.embedding.slice(0, 6).map(x => x.toFixed(3)).join(", ");
      setResult(panel, "done",
        el("p", {}, `A ${body.embedding.length}-dimensional embedding: `, el("code", {}, `[${head}, …]`)),
        el("p", {class: "muted"}, "Type two or more lines to compare sentences."),
        timings(body.roundTripMs, body.meta));
      return;
    }
    setResult(panel, "done", similarityView(texts, body.results.map(r => r.embedding)),
              timings(body.roundTripMs, body.meta));
  });
}

// -- bulk jobs (text models) -------------------------------------------------
// The same routes as any client. The page holds no API key: where the server has keys, the submit
// is answered 401 ("An API key is needed"), and a job is only ever reached with the key that
// submitted it (docs/jobs.md, "Ownership"). Were a key ever added here, the download link, a plain
// href that cannot carry a header, would have to become a fetch with the key.

const FINAL_STATES = ["done", "failed", "cancelled"];
const SHOWN_RESULTS = 50;  // a bulk job's first results shown on the page as they come

// The error of a failed fetch, as a sentence: the same titles as predict's.
async function failure(response) {
  let error = {};
  try { error = (await response.json()).error || {}; } catch { error = {}; }
  const title = CODE_TITLES[error.code] || STATUS_TITLES[response.status] || "Request failed";
  return errorBox(title, [error.message, `HTTP ${response.status}`].filter(Boolean).join(" · "));
}

function setupBulk(panel) {
  const box = $(panel, ".bulk");
  if (!box) return;
  const form = $(box, ".bulk-form"), textarea = $(form, "textarea"), file = $(form, "input[type=file]");
  const start = $(form, "button"), status = $(box, ".bulk-status"), bar = $(status, "progress");
  const line = $(status, ".bulk-line"), cancel = $(status, ".cancel"), download = $(status, ".download");
  const results = $(status, ".bulk-results");
  let job = null, ticket = 0;

  function problem(node) {
    box.dataset.jobState = "error";
    status.hidden = false;
    line.replaceChildren(node);
    cancel.hidden = true;
  }

  function show(body) {
    const {done, total, failed} = body.progress;
    const final = FINAL_STATES.includes(body.state);
    box.dataset.jobState = body.state;
    status.hidden = false;
    bar.value = total ? done / total : 1;
    line.textContent = `${body.state} · ${done.toLocaleString("en")} / ${total.toLocaleString("en")}` +
                       (failed ? ` · ${failed.toLocaleString("en")} failed` : "");
    cancel.hidden = final;
    download.hidden = !final;
    download.href = body.links.results;
    download.setAttribute("download", `${panel.dataset.model}-${body.id}.jsonl`);
    return final;
  }

  // The first results, each as it is answered, beside its line; the rest are in the download.
  function append(page, texts) {
    page.results.forEach((result, i) => {
      const index = page.offset + i;
      if (index >= SHOWN_RESULTS || result === null) return;
      const answer = result.error ? el("span", {class: "failed"}, result.error.message)
        : Array.isArray(result.embedding) ? `${result.embedding.length}-d [${result.embedding.slice(0, 3)
            .map(v => v.toFixed(3)).join(", ")}, …]`
        : Array.isArray(result.predictions) ? result.predictions[0].label : JSON.stringify(result).slice(0, 80);
      results.append(el("li", {}, el("span", {class: "text"}, texts[index]), el("span", {class: "answer"}, answer)));
    });
  }

  // The job's events (GET /v1/jobs/<id>/events): the browser's EventSource resumes a broken stream from
  // the last event's id by itself.
  function follow(mine, texts) {
    const source = new EventSource(`/v1/jobs/${job}/events`);
    const mineOnly = handle => event => { if (mine === ticket) handle(JSON.parse(event.data)); else source.close(); };
    source.addEventListener("progress", mineOnly(show));
    source.addEventListener("page", mineOnly(page => append(page, texts)));
    source.addEventListener("done", mineOnly(body => { show(body); source.close(); }));
    source.addEventListener("expired", mineOnly(body => { problem(errorBox("The job is gone", body.error.message));
                                                         source.close(); }));
    source.onerror = () => {  // closed for good (a 404 or 410): told; else the browser reconnects
      if (source.readyState === EventSource.CLOSED && mine === ticket && box.dataset.jobState !== "done") {
        problem(errorBox("Lost the job's events", "reload the page to follow it again"));
      }
    };
  }

  form.addEventListener("submit", async event => {
    event.preventDefault();
    const text = file.files[0] ? await file.files[0].text() : textarea.value;
    const texts = text.split(/\r?\n/).filter(t => t.trim());
    if (!texts.length) {
      problem(errorBox("Nothing to send", "type some lines, or choose a .txt file"));
      return;
    }
    const mine = ++ticket;
    start.disabled = true;
    box.dataset.jobState = "submitting";
    try {
      const response = await fetch(`/v1/models/${encodeURIComponent(panel.dataset.model)}/jobs`, {
        method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({texts})});
      if (mine !== ticket) return;
      if (response.status !== 202) {
        problem(await failure(response));
        return;
      }
      const body = await response.json();
      job = body.id;
      results.replaceChildren();
      show(body);
      follow(mine, texts);
    } catch {
      problem(errorBox("Could not reach the server", "check that it is running, then try again"));
    } finally {
      start.disabled = false;
    }
  });

  cancel.addEventListener("click", async () => {
    if (!job) return;
    cancel.disabled = true;
    try {
      const response = await fetch(`/v1/jobs/${job}`, {method: "DELETE"});
      if (response.ok) show(await response.json());
      else problem(await failure(response));
    } catch {
      problem(errorBox("Could not reach the server", "the job goes on; try again"));
    } finally {
      cancel.disabled = false;
    }
  });
}

// -- any JSON input ----------------------------------------------------------

// An answer the page has no picture for: its fields, as JSON, without the timings.
function jsonView(body) {
  const {meta, roundTripMs, ...answer} = body;
  return el("pre", {class: "json"}, JSON.stringify(answer, null, 2));
}

function setupJson(panel) {
  onLines(panel, ".json-form", "a JSON value", async lines => {
    let values;
    try {
      values = lines.map(line => JSON.parse(line));
    } catch (err) {
      setResult(panel, "error", errorBox("Not JSON", err.message));
      return;
    }
    const payload = values.length === 1 ? {input: values[0]} : {inputs: values};
    const body = await predict(panel, {headers: {"Content-Type": "application/json"},
                                       body: JSON.stringify(payload)});
    if (body) setResult(panel, "done", jsonView(body), timings(body.roundTripMs, body.meta));
  });
}

// -- any file ----------------------------------------------------------------

// Each chosen file is an item of one request, sent as the browser typed it (the task's types only).
function setupFile(panel) {
  const form = $(panel, ".file-form"), input = $(form, "input[type=file]"), button = $(form, "button");
  input.addEventListener("change", () => { button.disabled = !input.files.length; });
  form.addEventListener("submit", async event => {
    event.preventDefault();
    if (!input.files.length) return;
    const data = new FormData();
    for (const file of input.files) data.append("file", file, file.name);
    const body = await predict(panel, {body: data});
    if (body) setResult(panel, "done", jsonView(body), timings(body.roundTripMs, body.meta));
  });
}

// -- model picker ------------------------------------------------------------

function select(name) {
  const panels = document.querySelectorAll(".panel");
  if (![...panels].some(p => p.dataset.model === name)) return;
  panels.forEach(p => { p.hidden = p.dataset.model !== name; });
  document.querySelectorAll(".picker input").forEach(r => { r.checked = r.value === name; });
  history.replaceState(null, "", `#${encodeURIComponent(name)}`);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".panel[data-kind=image]").forEach(setupImage);
  document.querySelectorAll(".panel[data-kind=text]").forEach(setupText);
  document.querySelectorAll(".panel[data-kind=text]").forEach(setupBulk);
  document.querySelectorAll(".panel[data-kind=json]").forEach(setupJson);
  document.querySelectorAll(".panel[data-kind=file]").forEach(setupFile);
  document.querySelectorAll(".picker input").forEach(r => r.addEventListener("change", () => select(r.value)));
  if (location.hash) select(decodeURIComponent(location.hash.slice(1)));
  // Files dropped outside the drop zone would replace the page: ignore them.
  window.addEventListener("dragover", event => event.preventDefault());
  window.addEventListener("drop", event => event.preventDefault());
});
