// The dashboard: a view of the queue through its own API, with the caller's scopes
// (anonymous: the server's AZQUEUE_ANONYMOUS_SCOPES). Every value shown is set as text,
// never as markup, and every link is built from URI-encoded identifiers.
"use strict";

const API = "/api/queue/v1";
const REFRESH_MS = 3000;
const LOG_POLL_MS = 2000;
const MAX_COUNTED_QUEUES = 50;
const MAX_DETAILED_WORKERS = 20;

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path) {
  const response = await fetch(API + path, { headers: { Accept: "application/json" } });
  let body = null;
  try {
    body = await response.json();
  } catch (e) {
    body = null;
  }
  if (!response.ok) {
    const message = body && body.message ? body.message.split("\n")[0] : response.statusText;
    throw new ApiError(response.status, `${response.status}: ${message}`);
  }
  return body;
}

// Like api(), but a missing or forbidden endpoint is a note on the page, not a failure.
async function optional(path) {
  try {
    return { value: await api(path) };
  } catch (e) {
    if (e instanceof ApiError) return { error: e.message };
    throw e;
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
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

function table(headers, rows) {
  if (!rows.length) return note("none");
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) =>
      typeof c === "number" ? el("td", { class: "num" }, c) : el("td", {}, c))))));
}

function dl(pairs) {
  return el("dl", {}, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

// -- views ------------------------------------------------------------------------------

async function overview() {
  const out = [el("h1", {}, "Task queues")];
  const listed = await optional("/task-queues?limit=100");
  if (listed.error) {
    out.push(failure(`Cannot list task queues (${listed.error}).`));
  } else {
    const queues = listed.value.taskQueues || [];
    const counted = await Promise.all(queues.slice(0, MAX_COUNTED_QUEUES).map((q) =>
      optional(`/task-queues/${enc(q.taskQueueId)}/counts`)));
    out.push(table(["task queue", "pending", "claimed", "last active"], queues.map((q, i) => {
      const counts = counted[i] && counted[i].value;
      return [queueLink(q.taskQueueId), counts ? counts.pendingTasks : "",
        counts ? counts.claimedTasks : "", when(q.lastDateActive)];
    })));
  }
  out.push(note("Open a task or a task group by its ID above."));
  return out;
}

async function queuePage(taskQueueId) {
  const [provisionerId, workerType] = taskQueueId.split("/");
  const path = `/task-queues/${enc(taskQueueId)}`;
  const [counts, pending, claimed, workers] = await Promise.all([
    optional(`${path}/counts`), optional(`${path}/pending?limit=50`),
    optional(`${path}/claimed?limit=50`),
    optional(`/provisioners/${enc(provisionerId)}/worker-types/${enc(workerType)}/workers?limit=50`),
  ]);
  const out = [el("h1", {}, `Task queue ${taskQueueId}`)];
  out.push(counts.error ? failure(counts.error) : dl([
    ["pending tasks", counts.value.pendingTasks], ["claimed tasks", counts.value.claimedTasks]]));
  out.push(el("h2", {}, "Pending"));
  out.push(pending.error ? failure(pending.error) : table(["task", "run", "name", "priority"],
    (pending.value.tasks || []).map((t) => [taskLink(t.taskId), t.runId ?? "",
      t.task && t.task.metadata ? t.task.metadata.name : "", t.task ? t.task.priority : ""])));
  out.push(el("h2", {}, "Claimed"));
  out.push(claimed.error ? failure(claimed.error) : table(["task", "run", "worker", "claimed"],
    (claimed.value.tasks || []).map((t) => [taskLink(t.taskId), t.runId ?? "",
      `${t.workerGroup}/${t.workerId}`, when(t.claimed)])));
  out.push(el("h2", {}, "Workers"));
  if (workers.error) {
    out.push(failure(workers.error));
  } else {
    const list = workers.value.workers || [];
    const details = await Promise.all(list.slice(0, MAX_DETAILED_WORKERS).map((w) => optional(
      `/provisioners/${enc(provisionerId)}/worker-types/${enc(workerType)}/workers/` +
      `${enc(w.workerGroup)}/${enc(w.workerId)}`)));
    out.push(table(["worker", "last seen", "quarantined until", "recent tasks"], list.map((w, i) => {
      const detail = (details[i] && details[i].value) || {};
      const recent = detail.recentTasks || (w.latestTask ? [w.latestTask] : []);
      return [`${w.workerGroup}/${w.workerId}`, when(detail.lastDateActive || w.lastDateActive),
        w.quarantineUntil ? when(w.quarantineUntil) : "",
        el("span", {}, recent.slice(-5).reverse().map((t) => [taskLink(t.taskId), " "]))];
    })));
  }
  return out;
}

async function taskPage(taskId) {
  const [definition, status] = await Promise.all([
    api(`/task/${enc(taskId)}`), api(`/task/${enc(taskId)}/status`)]);
  const s = status.status;
  const meta = definition.metadata || {};
  const out = [el("h1", {}, meta.name || taskId), dl([
    ["taskId", taskLink(taskId)], ["state", state(s.state)],
    ["task queue", queueLink(definition.taskQueueId)],
    ["task group", groupLink(definition.taskGroupId)],
    ["priority", definition.priority], ["created", when(definition.created)],
    ["deadline", when(definition.deadline)], ["description", meta.description],
    ["owner", meta.owner], ["source", meta.source]])];
  out.push(el("h2", {}, "Runs"));
  const runs = s.runs || [];
  out.push(table(["run", "state", "created because", "resolved because", "worker", "started",
    "resolved"], runs.map((r) => [r.runId, state(r.state), r.reasonCreated,
    r.reasonResolved || "", r.workerId ? `${r.workerGroup}/${r.workerId}` : "",
    when(r.started), when(r.resolved)])));
  if (runs.length) {
    const last = runs[runs.length - 1];
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
// is another origin: without CORS for this page a link to the log stands instead.
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
  }

  view() {
    return this.unreadable ? el("p", {}, el("a", { href: this.apiUrl }, "open the log"))
      : this.pre;
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
    await follower.read();
  }
  follower.seen = generation;
  follower.follow(running);
  return follower.view();
}

async function groupPage(taskGroupId) {
  const [group, members] = await Promise.all([
    optional(`/task-group/${enc(taskGroupId)}`),
    api(`/task-group/${enc(taskGroupId)}/list?limit=1000`)]);
  const tasks = members.tasks || [];
  const byState = {};
  for (const t of tasks) byState[t.status.state] = (byState[t.status.state] || 0) + 1;
  const out = [el("h1", {}, `Task group ${taskGroupId}`)];
  out.push(dl([
    ["members", tasks.length + (members.continuationToken ? "+" : "")],
    ["states", el("span", {}, Object.entries(byState).map(([k, n]) => [state(k), ` ${n} `]))],
    ["scheduler", group.value ? group.value.schedulerId : ""],
    ["sealed", group.value && group.value.sealed ? when(group.value.sealed) : ""],
    ["expires", group.value ? when(group.value.expires) : ""]]));
  out.push(table(["task", "name", "state", "task queue"], tasks.map((t) => [
    taskLink(t.status.taskId), t.task.metadata ? t.task.metadata.name : "",
    state(t.status.state), queueLink(t.task.taskQueueId)])));
  return out;
}

// -- routing and refresh ----------------------------------------------------------------

const ROUTES = [
  [/^#\/task\/([^/]+)$/, (m) => taskPage(decodeURIComponent(m[1]))],
  [/^#\/group\/([^/]+)$/, (m) => groupPage(decodeURIComponent(m[1]))],
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
  const view = document.getElementById("view");
  const scrolled = window.scrollY;
  view.replaceChildren(...content.flat());
  window.scrollTo(0, scrolled);
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  timer = setTimeout(render, REFRESH_MS);
}

document.getElementById("open").addEventListener("submit", (event) => {
  event.preventDefault();
  const id = document.getElementById("open-id").value.trim();
  const what = event.submitter && event.submitter.value === "group" ? "group" : "task";
  if (id) location.hash = `#/${what}/${enc(id)}`;
});
window.addEventListener("hashchange", render);
render();
