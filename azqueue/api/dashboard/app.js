// The dashboard: a view of the queue through its own API, with the caller's scopes:
// anonymous (the server's AZQUEUE_ANONYMOUS_SCOPES) until the operator signs in with a
// clientId and accessToken, kept in this tab's sessionStorage, which then sign every
// request (Hawk, computed here with WebCrypto); the server checks the scopes as for any
// client. Every value shown is set as text, never as markup, and every link is built
// from URI-encoded identifiers.
//
// One file of some 800 lines on purpose: the page has no build step and no module loader,
// and its parts (Hawk, elements, charts, actions, views) share one refresh loop and its
// state; the `-- part --` lines below divide it instead.
"use strict";

const API = "/api/queue/v1";
const RECENT = "/dashboard/recent";
const REFRESH_MS = 3000;
const LOG_POLL_MS = 2000;
const MAX_COUNTED_QUEUES = 50;
const MAX_DETAILED_WORKERS = 20;
const MAX_GROUP_PAGES = 4;
// A group page reads each member it shows (up to 200 reads): it refreshes less often.
const GROUP_REFRESH_MS = 15000;
const CREDENTIALS = "azqueue.credentials";
const BACKLOG = "azqueue.backlog";
const BACKLOG_KEEP_MS = 30 * 60 * 1000;
const BACKLOG_MAX_POINTS = 600;
const THROUGHPUT_MINUTES = 30;
// Names the recent lists lack (tasks another replica made) are read from the definitions,
// at most this many per refresh, and kept for the page's life (a definition never changes).
const MAX_NAMES_READ = 20;
const names = new Map();
// The task states, those resolved, and the priorities (highest first), as the server's
// model names them: a data block of the page (azqueue/api/dashboard/__init__.py).
const MODEL = JSON.parse(document.getElementById("model").textContent);
const STATES = MODEL.states;
const RESOLVED = MODEL.resolved;
const PRIORITIES = MODEL.priorities;
const CLIENT_ID = /^[A-Za-z0-9!@/:.+|_-]+$/;
// The releases of the replicas whose recent lists answered (label -> when), shown while
// met in the last five minutes: behind a load balancer, a rollout shows two.
const releases = new Map();
const RELEASES_KEEP_MS = 5 * 60 * 1000;

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// -- credentials and Hawk -----------------------------------------------------------------

function credentials() {
  try {
    const saved = JSON.parse(sessionStorage.getItem(CREDENTIALS));
    return saved && saved.clientId && saved.accessToken ? saved : null;
  } catch (e) {
    return null;
  }
}

const utf8 = (text) => new TextEncoder().encode(text);
const base64 = (buffer) => btoa(String.fromCharCode(...new Uint8Array(buffer)));

async function hmacSha256(key, text) {
  const imported = await crypto.subtle.importKey("raw", utf8(key),
    { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return base64(await crypto.subtle.sign("HMAC", imported, utf8(text)));
}

// The Authorization header of a request, as Hawk (sha256) defines it: a MAC over the
// time, a nonce, the method, the request target, host and port, and the payload's hash.
async function hawkHeader(creds, method, url, body, contentType) {
  const target = new URL(url, location.href);
  const ts = Math.floor(Date.now() / 1000);
  const nonce = base64(crypto.getRandomValues(new Uint8Array(9))).replace(/[+/=]/g, "");
  const port = target.port || (target.protocol === "https:" ? "443" : "80");
  const hash = body === undefined ? "" : base64(await crypto.subtle.digest("SHA-256",
    utf8(`hawk.1.payload\n${contentType}\n${body}\n`)));
  const normalized = ["hawk.1.header", ts, nonce, method.toUpperCase(),
    target.pathname + target.search, target.hostname.toLowerCase(), port, hash, ""]
    .join("\n") + "\n";
  const mac = await hmacSha256(creds.accessToken, normalized);
  return `Hawk id="${creds.clientId}", ts="${ts}", nonce="${nonce}"` +
    (hash ? `, hash="${hash}"` : "") + `, mac="${mac}"`;
}

async function request(url, method = "GET", payload = undefined) {
  const headers = { Accept: "application/json" };
  const body = payload === undefined ? undefined : JSON.stringify(payload);
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const creds = credentials();
  if (creds) headers.Authorization = await hawkHeader(creds, method, url, body, "application/json");
  const response = await fetch(url, { method, headers, body });
  let answer = null;
  try {
    answer = await response.json();
  } catch (e) {
    answer = null;
  }
  if (!response.ok) {
    const message = answer && answer.message ? answer.message.split("\n")[0] : response.statusText;
    throw new ApiError(response.status, `${response.status}: ${message}`);
  }
  return answer;
}

const api = (path, method, payload) => request(API + path, method, payload);

// Like request(), but a missing or forbidden endpoint is a note on the page, not a failure.
async function attempt(url) {
  try {
    return { value: await request(url) };
  } catch (e) {
    if (e instanceof ApiError) return { error: e.message };
    throw e;
  }
}

const optional = (path) => attempt(API + path);

// -- elements ---------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  return fill(node, attrs, children);
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG, tag), attrs, children);
}

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class" && !(node instanceof SVGElement)) node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const enc = encodeURIComponent;
const taskLink = (taskId) => el("a", { href: `#/task/${enc(taskId)}`, class: "id" }, taskId);
const groupLink = (groupId) => el("a", { href: `#/group/${enc(groupId)}`, class: "id" }, groupId);
const queueLink = (id) => el("a", { href: `#/queue/${enc(id)}` }, id);
const state = (s) => el("span", { class: `state state-${s}`, "data-state": s }, s);
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");
const note = (text) => el("p", { class: "note" }, text);
const failure = (text) => el("p", { class: "error" }, text);

// A duration in its largest units: "45s", "3m 20s", "2h 5m", "1d 3h".
function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

const since = (from, to) => (from ? duration((to ? Date.parse(to) : Date.now()) - Date.parse(from)) : "");
// How long a run waited to be claimed, and how long it ran (so far, if it still does).
const waited = (r) => (r.state === "pending" ? since(r.scheduled) : since(r.scheduled, r.started));
const ran = (r) => (r.started ? since(r.started, r.resolved) : "");

function table(headers, rows, attrs) {
  if (!rows.length) return note("none");
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) =>
      typeof c === "number" ? el("td", { class: "num" }, c) : el("td", {}, c))))));
}

function dl(pairs) {
  return el("dl", {}, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// Elements kept across the page's refreshes (forms being filled in, the log), by key:
// those a render does not ask for again are dropped.
const kept = new Map();

function keep(key, build) {
  let entry = kept.get(key);
  if (!entry) {
    entry = { node: build() };
    kept.set(key, entry);
  }
  entry.seen = generation;
  return entry.node;
}

// -- charts (SVG, drawn here) -------------------------------------------------------------

const WIDTH = 576;
const HEIGHT = 160;
const PAD = { left: 34, right: 8, top: 8, bottom: 18 };

function frame(max, first, last) {
  return [
    svg("line", { class: "axis", x1: PAD.left, y1: HEIGHT - PAD.bottom, x2: WIDTH - PAD.right,
      y2: HEIGHT - PAD.bottom }),
    svg("text", { x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, max),
    svg("text", { x: PAD.left - 4, y: HEIGHT - PAD.bottom, "text-anchor": "end" }, 0),
    svg("text", { x: PAD.left, y: HEIGHT - 4 }, first),
    svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 4, "text-anchor": "end" }, last),
  ];
}

function legend(entries) {
  return el("div", { class: "legend" }, entries.map(([cls, label]) => el("span", {},
    svg("svg", { viewBox: "0 0 10 10" }, svg("rect", { width: 10, height: 10, class: cls })),
    " ", label)));
}

const clock = (t) => new Date(t).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });

// Resolutions per minute by state, stacked bars, for the last THROUGHPUT_MINUTES minutes.
function throughputChart(minutes, caption) {
  const now = Math.floor(Date.now() / 60000);
  const byMinute = new Map(minutes.map((m) => [Math.floor(Date.parse(m.minute) / 60000), m]));
  const slots = [];
  for (let m = now - THROUGHPUT_MINUTES + 1; m <= now; m++) slots.push([m, byMinute.get(m) || {}]);
  const max = Math.max(1, ...slots.map(([, m]) => RESOLVED.reduce((n, s) => n + (m[s] || 0), 0)));
  const step = (WIDTH - PAD.left - PAD.right) / slots.length;
  const scale = (HEIGHT - PAD.top - PAD.bottom) / max;
  const bars = [];
  slots.forEach(([, m], i) => {
    let y = HEIGHT - PAD.bottom;
    for (const s of RESOLVED) {
      const h = (m[s] || 0) * scale;
      if (!h) continue;
      y -= h;
      bars.push(svg("rect", { class: `fill-${s}`, "data-state": s, "data-count": m[s],
        x: (PAD.left + i * step + 1).toFixed(1), y: y.toFixed(1),
        width: Math.max(1, step - 2).toFixed(1), height: h.toFixed(1) },
      svg("title", {}, `${m[s]} ${s}`)));
    }
  });
  return el("figure", { class: "throughput" },
    el("figcaption", {}, caption),
    svg("svg", { class: "chart", viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img",
      "aria-label": caption }, frame(max, clock(slots[0][0] * 60000), clock(now * 60000)), bars),
    legend(RESOLVED.map((s) => [`fill-${s}`, s])));
}

// Lines of pending tasks over time, one per task queue, from this tab's samples.
function backlogChart(series, caption) {
  const names = Object.keys(series).filter((n) => series[n].length).slice(0, 6);
  const points = names.flatMap((n) => series[n]);
  if (!points.length) return el("figure", { class: "backlog" }, el("figcaption", {}, caption),
    note("no samples yet"));
  const t0 = Math.min(...points.map(([t]) => t));
  const t1 = Math.max(t0 + 1000, ...points.map(([t]) => t));
  const max = Math.max(1, ...points.map(([, n]) => n));
  const x = (t) => PAD.left + (t - t0) / (t1 - t0) * (WIDTH - PAD.left - PAD.right);
  const y = (n) => HEIGHT - PAD.bottom - n / max * (HEIGHT - PAD.top - PAD.bottom);
  const lines = names.map((n, i) => svg("polyline", { class: `line line-${i}`, "data-queue": n,
    points: series[n].map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }));
  return el("figure", { class: "backlog" },
    el("figcaption", {}, caption),
    svg("svg", { class: "chart", viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img",
      "aria-label": caption }, frame(max, clock(t0), clock(t1)), lines),
    legend(names.map((n, i) => [`swatch-${i}`, n])));
}

// Pending counts this tab saw, kept in sessionStorage: the backlog chart's history.
function sampleBacklog(counts) {
  let history = {};
  try {
    history = JSON.parse(sessionStorage.getItem(BACKLOG)) || {};
  } catch (e) {
    history = {};
  }
  const now = Date.now();
  for (const [name, pending] of counts) {
    const points = (history[name] || []).filter(([t]) => now - t < BACKLOG_KEEP_MS);
    points.push([now, pending]);
    history[name] = points.slice(-BACKLOG_MAX_POINTS);
  }
  for (const name of Object.keys(history)) {
    if (!history[name].some(([t]) => now - t < BACKLOG_KEEP_MS)) delete history[name];
  }
  try {
    sessionStorage.setItem(BACKLOG, JSON.stringify(history));
  } catch (e) {
    // storage full: the chart shows what it has
  }
  return history;
}

// A group's states as one stacked bar.
function progressBar(byState, total) {
  let x = 0;
  const parts = STATES.filter((s) => byState[s]).map((s) => {
    const w = byState[s] / Math.max(1, total) * 100;
    const rect = svg("rect", { class: `fill-${s}`, "data-state": s, x: x.toFixed(2), y: 0,
      width: w.toFixed(2), height: 10 }, svg("title", {}, `${byState[s]} ${s}`));
    x += w;
    return rect;
  });
  return svg("svg", { class: "bar", viewBox: "0 0 100 10", preserveAspectRatio: "none",
    role: "img", "aria-label": "progress" }, parts);
}

// -- actions (signed in) --------------------------------------------------------------------

// A button that calls the API and shows what came back; the page refreshes after.
function action(label, run, attrs) {
  const out = el("span", { class: "result", role: "status" });
  const button = el("button", { type: "button", ...(attrs || {}) }, label);
  button.addEventListener("click", async () => {
    if (attrs && attrs["data-confirm"] && !window.confirm(attrs["data-confirm"])) return;
    button.disabled = true;
    out.className = "result";
    out.textContent = "…";
    try {
      await run();
      out.textContent = "done";
      render();
    } catch (e) {
      out.className = "result error";
      out.textContent = e instanceof ApiError ? e.message : String(e);
    } finally {
      button.disabled = false;
    }
  });
  return [button, out];
}

function taskActions(taskId, s, priority) {
  if (!credentials()) return note("Sign in to cancel, rerun or change the priority.");
  return keep(`actions/${taskId}`, () => {
    const select = el("select", { "aria-label": "new priority" },
      PRIORITIES.map((p) => el("option", { value: p }, p)));
    // A definition's "normal" is the lowest.
    select.value = PRIORITIES.includes(priority) ? priority : PRIORITIES[PRIORITIES.length - 1];
    return el("div", { class: "actions" },
      action("cancel", () => api(`/task/${enc(taskId)}/cancel`, "POST", {}), { name: "cancel",
        "data-confirm": `Cancel task ${taskId}? Its run resolves exception (canceled) and ` +
          "its worker stops it." }),
      action("rerun", () => api(`/task/${enc(taskId)}/rerun`, "POST", {}), { name: "rerun" }),
      select,
      action("change priority", () => api(`/task/${enc(taskId)}/priority`, "POST",
        { newPriority: select.value }), { name: "priority" }));
  });
}

function quarantineAction(provisionerId, workerType, w) {
  const path = `/provisioners/${enc(provisionerId)}/worker-types/${enc(workerType)}/workers/` +
    `${enc(w.workerGroup)}/${enc(w.workerId)}`;
  return keep(`quarantine/${provisionerId}/${workerType}/${w.workerGroup}/${w.workerId}`, () => {
    const hours = el("select", { "aria-label": "quarantine for" },
      [["1 h", 1], ["1 day", 24], ["1 week", 168], ["lift", 0]].map(([label, h]) =>
        el("option", { value: h }, label)));
    return el("span", { class: "actions" }, hours, action("quarantine", () => api(path, "PUT", {
      quarantineUntil: new Date(Date.now() + Number(hours.value) * 3600000).toISOString(),
    }), { name: "quarantine" }));
  });
}

// -- views ------------------------------------------------------------------------------

// The recent lists' tasks with their names: those the server did not give, from their
// definitions (a name the caller may not read stays empty).
async function withNames(recent) {
  if (!recent.value) return recent;
  const { tasks, failures } = recent.value;
  const missing = [...new Set([...failures, ...tasks].filter((t) => !t.name && !names.has(t.taskId))
    .map((t) => t.taskId))].slice(0, MAX_NAMES_READ);
  const read = await Promise.all(missing.map((taskId) => optional(`/task/${enc(taskId)}`)));
  missing.forEach((taskId, i) => {
    const meta = read[i].value && read[i].value.metadata;
    names.set(taskId, meta ? meta.name : "");
  });
  const named = (t) => (t.name ? t : { ...t, name: names.get(t.taskId) || "" });
  return { value: { ...recent.value, tasks: tasks.map(named), failures: failures.map(named) } };
}

// The recent lists of `url`, their release noted and their names filled in.
async function recentFrom(url) {
  const recent = await attempt(url);
  if (recent.value) {
    const r = recent.value.release;
    // A replica of a release before 1.0.0 names none.
    const label = r ? `${r.version}${r.commit ? ` (${r.commit.slice(0, 7)})` : ""}` : "before 1.0.0";
    releases.set(label, Date.now());
  }
  return withNames(recent);
}

function showReleases() {
  for (const [label, seen] of releases) {
    if (Date.now() - seen > RELEASES_KEEP_MS) releases.delete(label);
  }
  const labels = [...releases.keys()].sort();
  document.getElementById("releases").textContent = !labels.length ? "" :
    `azqueue ${labels.join(", ")}${labels.length > 1 ? ` (${labels.length} releases serving)` : ""}`;
}

function recentLists(recent) {
  const out = [];
  if (recent.error) return [failure(`Cannot read recent changes (${recent.error}).`)];
  const { tasks, failures, note: where } = recent.value;
  out.push(el("h2", {}, `Failed and exception runs (${where})`));
  out.push(table(["task", "name", "state", "reason", "task queue", "ran", "resolved"],
    failures.map((t) => [taskLink(t.taskId), t.name, state(t.state), t.reasonResolved || "",
      queueLink(t.taskQueueId), ran(t), when(t.resolved)]), { class: "failures" }));
  out.push(el("h2", {}, `Recent tasks (${where})`));
  out.push(table(["task", "name", "state", "task queue", "waited", "ran", "changed"],
    tasks.map((t) => [taskLink(t.taskId), t.name, state(t.state), queueLink(t.taskQueueId),
      waited(t), ran(t), when(t.changed)]), { class: "recent" }));
  return out;
}

async function overview() {
  const out = [el("h1", {}, "Task queues")];
  const [listed, recent] = await Promise.all([optional("/task-queues?limit=100"),
    recentFrom(RECENT)]);
  let history = {};
  if (listed.error) {
    out.push(failure(`Cannot list task queues (${listed.error}).`));
  } else {
    const queues = listed.value.taskQueues || [];
    const counted = await Promise.all(queues.slice(0, MAX_COUNTED_QUEUES).map((q) =>
      optional(`/task-queues/${enc(q.taskQueueId)}/counts`)));
    history = sampleBacklog(queues.map((q, i) => [q.taskQueueId, counted[i] && counted[i].value])
      .filter(([, c]) => c).map(([n, c]) => [n, c.pendingTasks]));
    out.push(table(["task queue", "pending", "running", "last active"], queues.map((q, i) => {
      const counts = counted[i] && counted[i].value;
      return [queueLink(q.taskQueueId), counts ? counts.pendingTasks : "",
        counts ? counts.claimedTasks : "", when(q.lastDateActive)];
    }), { class: "queues" }));
  }
  const busiest = Object.fromEntries(Object.entries(history)
    .sort(([, a], [, b]) => Math.max(...b.map(([, n]) => n)) - Math.max(...a.map(([, n]) => n))));
  out.push(el("div", { class: "charts" },
    recent.value ? throughputChart(recent.value.throughput,
      `Tasks resolved per minute, by state (${recent.value.note})`) : null,
    backlogChart(busiest, "Pending tasks per task queue (sampled by this page while open)")));
  out.push(...recentLists(recent));
  out.push(note("Open a task or a task group by its ID above."));
  return out;
}

async function queuePage(taskQueueId) {
  const [provisionerId, workerType] = taskQueueId.split("/");
  const path = `/task-queues/${enc(taskQueueId)}`;
  const workersPath = `/provisioners/${enc(provisionerId)}/worker-types/${enc(workerType)}/workers`;
  const [counts, pending, claimed, workers, recent] = await Promise.all([
    optional(`${path}/counts`), optional(`${path}/pending?limit=50`),
    optional(`${path}/claimed?limit=50`), optional(`${workersPath}?limit=50`),
    recentFrom(`${RECENT}?taskQueueId=${enc(taskQueueId)}`),
  ]);
  const out = [el("h1", {}, `Task queue ${taskQueueId}`)];
  const pendingTasks = pending.value ? (pending.value.tasks || []) : [];
  const oldest = pendingTasks.map((t) => t.inserted).filter(Boolean).sort()[0];
  const history = counts.value ? sampleBacklog([[taskQueueId, counts.value.pendingTasks]]) : {};
  out.push(counts.error ? failure(counts.error) : dl([
    ["pending tasks", counts.value.pendingTasks], ["running tasks", counts.value.claimedTasks],
    ["oldest pending has waited", oldest ? since(oldest) : ""]]));
  out.push(el("div", { class: "charts" },
    recent.value ? throughputChart(recent.value.throughput,
      `Tasks resolved per minute, by state (${recent.value.note})`) : null,
    backlogChart({ [taskQueueId]: history[taskQueueId] || [] },
      "Pending tasks (sampled by this page while open)")));
  out.push(el("h2", {}, "Pending, longest waiting first"));
  out.push(pending.error ? failure(pending.error) : table(["task", "run", "name", "priority",
    "waiting"], [...pendingTasks].sort((a, b) => (a.inserted < b.inserted ? -1 : 1)).map((t) => [
    taskLink(t.taskId), t.runId ?? "", t.task && t.task.metadata ? t.task.metadata.name : "",
    t.task ? t.task.priority : "", since(t.inserted)]), { class: "pending" }));
  // The API lists no unscheduled tasks: those heard of lately are in the recent changes.
  const unscheduled = recent.value ? recent.value.tasks.filter((t) => t.state === "unscheduled")
    : [];
  out.push(el("h2", {}, `Unscheduled, waiting on dependencies (${recent.value ?
    recent.value.note : "recent changes unreadable"})`));
  out.push(table(["task", "name", "since"], unscheduled.map((t) => [taskLink(t.taskId), t.name,
    when(t.changed)]), { class: "unscheduled" }));
  // listClaimedTasks lists runs once they have run a while (the claim index); runs this
  // replica saw claimed since are added from its recent changes.
  const running = claimed.value ? (claimed.value.tasks || []) : [];
  const listed = new Set(running.map((t) => t.taskId));
  for (const t of (recent.value ? recent.value.tasks : [])) {
    if (t.state === "running" && !listed.has(t.taskId)) {
      running.push({ taskId: t.taskId, runId: t.runId, workerGroup: t.workerGroup,
        workerId: t.workerId, claimed: t.started, task: { metadata: { name: t.name } } });
    }
  }
  out.push(el("h2", {}, "Running"));
  out.push(claimed.error ? failure(claimed.error) : table(["task", "run", "name", "worker",
    "running for"], running.map((t) => [taskLink(t.taskId), t.runId ?? "",
    t.task && t.task.metadata ? t.task.metadata.name : "", `${t.workerGroup}/${t.workerId}`,
    since(t.claimed)]), { class: "running" }));
  out.push(el("h2", {}, "Workers"));
  if (workers.error) {
    out.push(failure(workers.error));
  } else {
    const list = workers.value.workers || [];
    const details = await Promise.all(list.slice(0, MAX_DETAILED_WORKERS).map((w) => optional(
      `${workersPath}/${enc(w.workerGroup)}/${enc(w.workerId)}`)));
    const now = new Date().toISOString();
    const quarantined = (w) => w.quarantineUntil && w.quarantineUntil > now;
    const runs = (w) => running.filter((t) => t.workerGroup === w.workerGroup &&
      t.workerId === w.workerId);
    out.push(dl([["active", list.filter((w) => !quarantined(w)).length],
      ["quarantined", list.filter(quarantined).length]]));
    const signedIn = !!credentials();
    out.push(table(["worker", "state", "running now", "last seen", "recent tasks",
      ...(signedIn ? ["quarantine"] : [])], list.map((w, i) => {
      const detail = (details[i] && details[i].value) || {};
      const recentTasks = detail.recentTasks || (w.latestTask ? [w.latestTask] : []);
      return [`${w.workerGroup}/${w.workerId}`,
        quarantined(w) ? `quarantined until ${when(w.quarantineUntil)}` : "active",
        el("span", {}, runs(w).map((t) => [taskLink(t.taskId), " "])),
        when(detail.lastDateActive || w.lastDateActive),
        el("span", {}, recentTasks.slice(-5).reverse().map((t) => [taskLink(t.taskId), " "])),
        ...(signedIn ? [quarantineAction(provisionerId, workerType, w)] : [])];
    }), { class: "workers" }));
  }
  out.push(...recentLists(recent));
  return out;
}

async function taskPage(taskId) {
  const [definition, status] = await Promise.all([
    api(`/task/${enc(taskId)}`), api(`/task/${enc(taskId)}/status`)]);
  const s = status.status;
  const meta = definition.metadata || {};
  const runs = s.runs || [];
  const last = runs.length ? runs[runs.length - 1] : null;
  const out = [el("h1", {}, meta.name || taskId), dl([
    ["taskId", taskLink(taskId)], ["state", state(s.state)],
    ["task queue", queueLink(definition.taskQueueId)],
    ["task group", groupLink(definition.taskGroupId)],
    ["priority", definition.priority], ["created", when(definition.created)],
    ["deadline", when(definition.deadline)],
    [last && last.state === "pending" ? "pending for" : "", last && last.state === "pending"
      ? waited(last) : ""],
    [last && last.state === "running" ? "running for" : "", last && last.state === "running"
      ? ran(last) : ""],
    ["description", meta.description], ["owner", meta.owner], ["source", meta.source]]),
  taskActions(taskId, s, definition.priority)];
  out.push(el("h2", {}, "Runs"));
  out.push(table(["run", "state", "created because", "resolved because", "worker", "waited",
    "ran", "started", "resolved"], runs.map((r) => [r.runId, state(r.state), r.reasonCreated,
    r.reasonResolved || "", r.workerId ? `${r.workerGroup}/${r.workerId}` : "", waited(r),
    ran(r), when(r.started), when(r.resolved)]), { class: "runs" }));
  if (last) {
    const listed = await optional(`/task/${enc(taskId)}/runs/${last.runId}/artifacts`);
    out.push(el("h2", {}, `Artifacts of run ${last.runId}`));
    if (listed.error) {
      out.push(failure(listed.error));
    } else {
      const artifacts = listed.value.artifacts || [];
      const url = (a) => `${API}/task/${enc(taskId)}/runs/${last.runId}/artifacts/` +
        a.name.split("/").map(enc).join("/");
      out.push(table(["name", "type", "content type", "expires"], artifacts.map((a) => [
        el("a", { href: url(a) }, a.name), a.storageType, a.contentType || "", when(a.expires)])));
      const log = artifacts.find((a) => /^public\/logs\/live(_backing)?\.log$/.test(a.name));
      if (log) {
        out.push(el("h2", {}, "Log"), await logView(`${taskId}/${last.runId}/${log.name}`,
          url(log), last.state === "running"));
      }
    }
  }
  out.push(el("h2", {}, "Definition"), el("pre", {}, JSON.stringify(definition, null, 2)));
  return out;
}
// The log of the run on screen, kept across the page's refreshes: while the run runs it
// reads only the bytes added since (a Range read of the blob every LOG_POLL_MS), appends
// them as text, and stops after the first read that follows the run's resolution and
// finds nothing new (the worker appends the whole log before it reports). Blob storage
// is another origin: without CORS for this page a link to the log stands instead. While
// "follow" is ticked the log keeps its newest line in view; scrolling up unticks it.
class LogFollower {
  constructor(key, apiUrl) {
    this.key = key;
    this.apiUrl = apiUrl;
    this.blobUrl = null;
    this.offset = 0;
    this.decoder = new TextDecoder();
    this.pre = el("pre", { class: "log" });
    this.running = false;
    this.unreadable = false;
    this.stopped = false;
    this.timer = null;
    this.seen = 0;
    this.follow_ = el("input", { type: "checkbox", name: "follow" });
    this.follow_.checked = true;
    this.follow_.addEventListener("change", () => this.scroll());
    this.pre.addEventListener("scroll", () => {
      const atEnd = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
      if (!atEnd && this.pre.dataset.scrolling !== "1") this.follow_.checked = false;
      delete this.pre.dataset.scrolling;
    });
    this.box = el("label", { class: "follow" }, this.follow_, " follow the log");
  }

  view() {
    return this.unreadable ? el("p", {}, el("a", { href: this.apiUrl }, "open the log"))
      : el("div", {}, this.running ? this.box : null, this.pre);
  }

  scroll() {
    if (!this.follow_.checked || this.pre.scrollHeight <= this.pre.clientHeight) return;
    this.pre.dataset.scrolling = "1";
    this.pre.scrollTop = this.pre.scrollHeight;
  }

  // What the blob holds after `offset`, asked from the byte before it, so that the answer
  // is never an empty range (416): bytes already shown are dropped.
  async read() {
    const headers = this.offset > 0 ? { Range: `bytes=${this.offset - 1}-` } : {};
    let response;
    try {
      response = await fetch(this.blobUrl || this.apiUrl, { headers });
      if (response.status === 403 && this.blobUrl) { // the read URL expired: a fresh one
        this.blobUrl = null;
        response = await fetch(this.apiUrl, { headers });
      }
    } catch (e) {
      this.unreadable = true; // blob storage does not let this page read (no CORS)
      return 0;
    }
    if (!response.ok) return 0; // not there yet, or gone: the next read tells
    if (response.redirected) this.blobUrl = response.url;
    const bytes = new Uint8Array(await response.arrayBuffer());
    const known = this.offset > 0 ? (response.status === 206 ? 1 : this.offset) : 0;
    const fresh = bytes.subarray(Math.min(known, bytes.length));
    if (fresh.length) {
      this.offset += fresh.length;
      this.pre.append(document.createTextNode(this.decoder.decode(fresh, { stream: true })));
      this.scroll();
    }
    return fresh.length;
  }

  // Told at each refresh of the page whether the run still runs.
  follow(running) {
    this.running = running;
    if (!this.timer && !this.stopped && !this.unreadable) this.schedule();
  }

  schedule() {
    this.timer = setTimeout(async () => {
      const wasRunning = this.running;
      const added = await this.read();
      this.timer = null;
      if (!this.stopped && (wasRunning || added > 0)) this.schedule();
    }, LOG_POLL_MS);
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

let follower = null;

async function logView(key, url, running) {
  if (!follower || follower.key !== key) {
    if (follower) follower.stop();
    follower = new LogFollower(key, url);
    follower.running = running;
    await follower.read();
  }
  follower.seen = generation;
  follower.follow(running);
  return follower.view();
}

// Members of a group, following continuation tokens for at most MAX_GROUP_PAGES pages.
async function groupMembers(taskGroupId) {
  const tasks = [];
  let token = null;
  for (let page = 0; page < MAX_GROUP_PAGES; page++) {
    const query = token ? `?continuationToken=${enc(token)}` : "";
    const listed = await api(`/task-group/${enc(taskGroupId)}/list${query}`);
    tasks.push(...(listed.tasks || []));
    token = listed.continuationToken;
    if (!token) break;
  }
  return { tasks, more: !!token };
}

async function groupPage(taskGroupId, only) {
  const [group, members] = await Promise.all([
    optional(`/task-group/${enc(taskGroupId)}`), groupMembers(taskGroupId)]);
  const tasks = members.tasks;
  const byState = {};
  for (const t of tasks) byState[t.status.state] = (byState[t.status.state] || 0) + 1;
  const resolved = RESOLVED.reduce((n, s) => n + (byState[s] || 0), 0);
  const out = [el("h1", {}, `Task group ${taskGroupId}`)];
  out.push(dl([
    ["members", tasks.length + (members.more ? "+ (the first shown)" : "")],
    ["resolved", `${resolved} of ${tasks.length}`],
    ["scheduler", group.value ? group.value.schedulerId : ""],
    ["sealed", group.value && group.value.sealed ? when(group.value.sealed) : ""],
    ["expires", group.value ? when(group.value.expires) : ""]]));
  out.push(progressBar(byState, tasks.length));
  const base = `#/group/${enc(taskGroupId)}`;
  out.push(el("p", { class: "filters" },
    el("a", { href: base }, `all ${tasks.length}`),
    STATES.filter((s) => byState[s]).map((s) => el("a", { href: `${base}/${s}` },
      state(s), ` ${byState[s]}`))));
  const order = (t) => ["failed", "exception", "running", "pending", "unscheduled", "completed"]
    .indexOf(t.status.state);
  const shown = tasks.filter((t) => !only || t.status.state === only)
    .sort((a, b) => order(a) - order(b));
  if (only) out.push(el("h2", {}, "Members ", state(only)));
  out.push(table(["task", "name", "state", "task queue", "waited", "ran"], shown.map((t) => {
    const runs = t.status.runs || [];
    const last = runs[runs.length - 1];
    return [taskLink(t.status.taskId), t.task.metadata ? t.task.metadata.name : "",
      state(t.status.state), queueLink(t.task.taskQueueId), last ? waited(last) : "",
      last ? ran(last) : ""];
  }), { class: "members" }));
  return out;
}

// -- routing and refresh ----------------------------------------------------------------

const ROUTES = [
  [/^#\/task\/([^/]+)$/, (m) => taskPage(decodeURIComponent(m[1]))],
  [/^#\/group\/([^/]+)(?:\/([a-z]+))?$/, (m) => groupPage(decodeURIComponent(m[1]), m[2])],
  [/^#\/queue\/(.+)$/, (m) => queuePage(decodeURIComponent(m[1]))],
  [/^(#\/?)?$/, () => overview()],
];

let generation = 0;
let timer = null;

async function render() {
  const mine = ++generation;
  clearTimeout(timer);
  let content;
  const hash = location.hash;
  const match = ROUTES.map(([re, view]) => [hash.match(re), view]).find(([m]) => m);
  try {
    content = match ? await match[1](match[0]) : [failure(`No such page: ${hash}`)];
  } catch (e) {
    content = [failure(e instanceof ApiError ? e.message : `The page failed: ${e}`)];
  }
  if (mine !== generation) return; // a newer render started meanwhile
  if (follower && follower.seen !== mine) { // the log's page was left
    follower.stop();
    follower = null;
  }
  for (const [key, entry] of kept) if (entry.seen !== mine) kept.delete(key);
  const view = document.getElementById("view");
  const scrolled = window.scrollY;
  view.replaceChildren(...content.flat());
  window.scrollTo(0, scrolled);
  if (follower) follower.scroll();
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  showReleases();
  timer = setTimeout(render, hash.startsWith("#/group/") ? GROUP_REFRESH_MS : REFRESH_MS);
}

function showSignedIn() {
  const creds = credentials();
  kept.clear(); // forms and answers of whoever was signed in before
  document.getElementById("signin").hidden = !!creds;
  document.getElementById("signed").hidden = !creds;
  document.getElementById("signed-as").textContent = creds ? `signed in as ${creds.clientId}` : "";
}

document.getElementById("signin").addEventListener("submit", async (event) => {
  event.preventDefault();
  const client = document.getElementById("signin-client");
  const clientId = client.value.trim();
  const token = document.getElementById("signin-token");
  const problem = document.getElementById("signin-error");
  problem.hidden = true;
  if (!window.crypto || !crypto.subtle) {
    problem.textContent = "Signing in needs the page served over HTTPS (or from localhost): " +
      "the browser offers WebCrypto only there.";
  } else if (!CLIENT_ID.test(clientId) || !token.value) {
    problem.textContent = "Give a clientId (letters, digits and !@/:.+|_-) and its accessToken.";
  } else {
    sessionStorage.setItem(CREDENTIALS, JSON.stringify({ clientId, accessToken: token.value }));
    // A signed request the server authenticates: a wrong accessToken answers 401 here.
    const checked = await attempt(RECENT);
    if (checked.error && checked.error.startsWith("401")) {
      sessionStorage.removeItem(CREDENTIALS);
      problem.textContent = `The queue refused these credentials (${checked.error}).`;
    } else {
      token.value = client.value = "";
      showSignedIn();
      render();
      return;
    }
  }
  problem.hidden = false;
});

document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(CREDENTIALS);
  showSignedIn();
  render();
});

document.getElementById("open").addEventListener("submit", (event) => {
  event.preventDefault();
  const id = document.getElementById("open-id").value.trim();
  const what = event.submitter && event.submitter.value === "group" ? "group" : "task";
  if (id) location.hash = `#/${what}/${enc(id)}`;
});
window.addEventListener("hashchange", render);
showSignedIn();
render();
