// taskline dashboard: plain JavaScript, no dependency, no build step.
//
// Truth comes from the API: pipeline totals from GET /api/v1/queues, workers from
// GET /api/v1/workers, declared job types from GET /api/v1/types, dead jobs from
// GET /api/v1/dlq (grouped by cause: /api/v1/dlq/groups), a job from GET /api/v1/jobs/<id>,
// workflows from GET /api/v1/workflows.
// The live stream (GET /api/v1/events, Server-Sent Events) makes it move: every change
// re-reads the affected totals (at most once a second), feeds the chart and the event list,
// and counts succeeded/cancelled since the page opened. Actions are the CLI's API calls.
// GET /api/v1/whoami tells what the token may do: data is shown only with jobs:read, and a
// button whose call needs a scope the token lacks is disabled with a tooltip saying so.
"use strict";

(() => {
  const API = "/api/v1";
  const TOKEN_KEY = "taskline-token";
  const BATCH = 1000;                    // POST /api/v1/jobs/batch takes at most 1,000 jobs
  const BUCKET_S = 5;                    // chart resolution
  const WINDOW_S = 300;                  // chart span: five minutes
  const FEED_SIZE = 40;
  const SEEN_SIZE = 20000;               // event ids remembered to drop a replayed duplicate
  const STAGES = ["scheduled", "waiting", "queued", "running", "retrying", "succeeded", "dead", "cancelled"];
  const PRIORITIES = { low: 2, normal: 5, high: 7, critical: 9 };
  const FAILED_EVENTS = new Set(["retry_scheduled", "dead_lettered"]);
  const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
  const READ = "jobs:read";
  const WRITE = "jobs:write";
  const OPERATE = "jobs:operate";

  const $ = (id) => document.getElementById(id);
  const clock = (iso) => new Date(iso).toLocaleTimeString([], { hour12: false });

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || "",
    source: null,
    lastId: null,
    reconnectDelay: 1000,
    reconnectTimer: null,
    seen: new Set(),
    seenOrder: [],
    since: { succeeded: 0, cancelled: 0 },
    buckets: new Map(),                 // bucket start (s) -> {ok, failed}
    feed: [],
    historyId: null,
    dirty: { queues: true, workers: true, dead: true, limits: true, history: false, workflows: true,
             causes: true, view: true },
    lastFetch: { queues: 0, workers: 0, dead: 0, limits: 0, history: 0, workflows: 0, causes: 0 },
    inflight: {},
    principal: null,                    // GET /api/v1/whoami; null until it answered
  };

  // --- the API ----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(API + path, {
      method, headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await response.json().catch(() => null);
    if (response.status === 403 && path === "/whoami") {
      return { name: null, kind: "token", scopes: [], authentication: true };
    }
    if (response.status === 401) {
      askForToken(state.token ? "That token was refused." : "");
      throw new ApiError(401, "a valid API token is required");
    }
    if (!response.ok) {
      const message = data && data.error ? data.error.message : response.statusText;
      throw new ApiError(response.status, message);
    }
    return data;
  }

  function notify(message, kind = "info") {
    const notice = $("notice");
    notice.textContent = message;
    notice.dataset.kind = kind;
  }

  // --- token and scopes -------------------------------------------------------------------

  // Until whoami answers, every call is tried: the API, not the page, enforces the scopes.
  function can(scope) {
    return state.principal === null || state.principal.scopes.includes(scope);
  }

  function lacking(scope) {
    const who = state.principal && state.principal.name ? ` (${state.principal.name})` : "";
    return `This token${who} lacks the ${scope} scope; connect with a token that has it.`;
  }

  // Disable `button` when the token lacks `scope`, with a tooltip saying why.
  function guard(button, scope, title = "") {
    const allowed = can(scope);
    button.disabled = !allowed;
    button.title = allowed ? title : lacking(scope);
    button.dataset.needs = scope;
    return button;
  }

  function applyPrincipal() {
    for (const button of document.querySelectorAll("button[data-needs]")) {
      guard(button, button.dataset.needs);
    }
    const who = state.principal;
    $("token-button").textContent = who && who.name ? `Token: ${who.name}` : "API token…";
    if (!can(READ)) {
      notify(lacking(READ) + " Nothing can be shown without it.", "error");
      setConnection("offline", `no ${READ}`);
      askForToken(lacking(READ));
    }
  }

  async function loadPrincipal() {
    try {
      state.principal = await api("GET", "/whoami");
    } catch (err) {
      if (err.status === 401) return false;
      state.principal = null;           // unknown: let the API decide call by call
    }
    applyPrincipal();
    return can(READ);
  }

  async function begin() {
    if (!(await loadPrincipal())) return;
    markAllDirty();
    connect();
  }

  function askForToken(error) {
    const dialog = $("token-dialog");
    $("token-error").textContent = error || "";
    if (!dialog.open) dialog.showModal();
    $("token-input").focus();
  }

  function onTokenSubmit(event) {
    event.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-dialog").close();
    $("token-input").value = "";
    begin();
  }

  // --- the live stream --------------------------------------------------------------------

  function setConnection(kind, text) {
    const el = $("connection");
    el.dataset.state = kind;
    el.textContent = text;
  }

  function connect() {
    clearTimeout(state.reconnectTimer);
    if (state.source) state.source.close();
    const params = new URLSearchParams();
    if (state.token) params.set("token", state.token);
    if (state.lastId !== null) params.set("last_event_id", String(state.lastId));
    const query = params.toString();
    const source = new EventSource(`${API}/events${query ? `?${query}` : ""}`);
    state.source = source;
    setConnection("connecting", "connecting…");
    source.addEventListener("open", () => {
      state.reconnectDelay = 1000;
      setConnection("live", "live");
    });
    source.addEventListener("job", (e) => onChange(JSON.parse(e.data)));
    source.addEventListener("gap", () => {
      notify("Some events were missed while disconnected; totals were re-read.", "info");
      markAllDirty();
    });
    source.addEventListener("dropped", () => setConnection("reconnecting", "reconnecting…"));
    source.addEventListener("error", () => onStreamError(source));
  }

  function onStreamError(source) {
    if (source !== state.source) return;
    if (source.readyState !== EventSource.CLOSED) {
      setConnection("reconnecting", "reconnecting…");   // EventSource retries by itself
      return;
    }
    // Closed for good (401, 503, server gone): retry with a growing delay, resuming after
    // the last event seen; an API call tells whether a token is what is missing.
    setConnection("offline", "offline, retrying…");
    api("GET", "/queues").then(applyQueues).catch(() => {});
    const delay = state.reconnectDelay;
    state.reconnectDelay = Math.min(delay * 2, 30000);
    state.reconnectTimer = setTimeout(connect, delay);
  }

  function remember(id) {
    if (state.seen.has(id)) return false;
    state.seen.add(id);
    state.seenOrder.push(id);
    if (state.seenOrder.length > SEEN_SIZE) state.seen.delete(state.seenOrder.shift());
    return true;
  }

  function onChange(change) {
    if (!remember(change.id)) return;
    state.lastId = change.id;
    if (change.status === "succeeded") state.since.succeeded += 1;
    if (change.status === "cancelled") state.since.cancelled += 1;
    countInChart(change);
    state.feed.unshift(change);
    if (state.feed.length > FEED_SIZE) state.feed.length = FEED_SIZE;
    state.dirty.queues = true;
    state.dirty.workers = true;
    state.dirty.limits = true;
    if (change.status === "dead" || change.event === "requeued") state.dirty.dead = state.dirty.causes = true;
    if (change.job_id === state.historyId) state.dirty.history = true;
    if (change.event === "waiting" || change.event === "unblocked") state.dirty.workflows = true;
    state.dirty.view = true;
  }

  // --- chart ------------------------------------------------------------------------------

  function countInChart(change) {
    const ok = change.event === "succeeded";
    const failed = FAILED_EVENTS.has(change.event);
    if (!ok && !failed) return;
    const at = Math.floor(Date.parse(change.created_at) / 1000) || Math.floor(Date.now() / 1000);
    const start = at - (at % BUCKET_S);
    const bucket = state.buckets.get(start) || { ok: 0, failed: 0 };
    if (ok) bucket.ok += 1; else bucket.failed += 1;
    state.buckets.set(start, bucket);
  }

  function series(now) {
    const last = now - (now % BUCKET_S);
    const points = [];
    for (let start = last - WINDOW_S + BUCKET_S; start <= last; start += BUCKET_S) {
      const bucket = state.buckets.get(start) || { ok: 0, failed: 0 };
      // The current bucket is still filling: a rate over the seconds it has lasted so far.
      const span = Math.min(BUCKET_S, now - start + 1);
      points.push({ start, ok: bucket.ok / span, failed: bucket.failed / span });
    }
    for (const start of state.buckets.keys()) {
      if (start <= last - WINDOW_S) state.buckets.delete(start);
    }
    return points;
  }

  function sumSince(now, seconds) {
    let ok = 0; let failed = 0;
    for (const [start, bucket] of state.buckets) {
      if (start > now - seconds - BUCKET_S) { ok += bucket.ok; failed += bucket.failed; }
    }
    return { ok, failed };
  }

  function svg(tag, attrs, text) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  }

  function renderChart() {
    const now = Math.floor(Date.now() / 1000);
    const points = series(now);
    const top = Math.max(1, ...points.map((p) => Math.max(p.ok, p.failed)));
    const [w, h, left, bottom, pad] = [600, 170, 44, 22, 8];
    const x = (i) => left + (i * (w - left - pad)) / (points.length - 1);
    const y = (v) => pad + (h - bottom - pad) * (1 - v / top);
    const chart = $("chart");
    chart.querySelectorAll("g").forEach((g) => g.remove());
    const g = svg("g", {});
    g.append(svg("line", { class: "axis", x1: left, y1: y(0), x2: w - pad, y2: y(0) }));
    g.append(svg("line", { class: "axis", x1: left, y1: pad, x2: left, y2: y(0) }));
    g.append(svg("text", { x: left - 6, y: pad + 8, "text-anchor": "end" }, fmtRate(top)));
    g.append(svg("text", { x: left - 6, y: y(0), "text-anchor": "end" }, "0"));
    g.append(svg("text", { x: left, y: h - 6 }, "−5 min"));
    g.append(svg("text", { x: w - pad, y: h - 6, "text-anchor": "end" }, "now"));
    for (const key of ["ok", "failed"]) {
      const line = points.map((p, i) => `${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ");
      g.append(svg("polyline", { class: key, points: line }));
    }
    chart.append(g);
    const recent = sumSince(now, 10);
    const minute = sumSince(now, 60);
    const attempts = minute.ok + minute.failed;
    $("throughput").textContent = fmtRate(recent.ok / 10);
    $("failure-rate").textContent = attempts ? `${Math.round((100 * minute.failed) / attempts)}%` : "0%";
    $("chart-summary").textContent = `Peak ${fmtRate(top)} jobs per second in the last five minutes; `
      + `${minute.ok} succeeded and ${minute.failed} failed attempts in the last minute.`;
  }

  function fmtRate(value) {
    return value >= 10 ? String(Math.round(value)) : value.toFixed(1);
  }

  // --- pipeline ---------------------------------------------------------------------------

  // The list is one page of queues (the first 100 by name); the pipeline shows the totals
  // over every queue, which the answer carries beside the page.
  function applyQueues(data) {
    const totals = Object.fromEntries(STAGES.map((s) => [s, 0]));
    const byPriority = Array(10).fill(0);
    for (const [status, n] of Object.entries(data.totals.counts)) totals[status] = (totals[status] || 0) + n;
    for (const [level, counts] of Object.entries(data.totals.priorities)) byPriority[Number(level)] += counts.queued || 0;
    for (const stage of ["scheduled", "waiting", "queued", "running", "retrying", "dead"]) setCount(stage, totals[stage] || 0);
    renderPriorities(byPriority);
    renderQueues(data.queues);
    renderDispatch(data.dispatch);
  }

  // While Redis is out, workers claim straight from PostgreSQL: slower, nothing stops.
  const DISPATCH_TEXT = {
    postgres: "Redis is unreachable: workers dispatch from PostgreSQL (slower; every job still runs).",
    rebuilding: "Redis answers but is not rebuilt yet: workers that lost it dispatch from PostgreSQL until the rebuild ends.",
  };

  function renderDispatch(dispatch) {
    const banner = $("dispatch");
    const mode = dispatch ? dispatch.mode : "redis";
    banner.dataset.mode = mode;
    banner.hidden = !DISPATCH_TEXT[mode];
    const text = DISPATCH_TEXT[mode] || "";
    if (banner.textContent !== text) banner.textContent = text;
  }

  function renderQueues(queues) {
    const body = $("queues-body");
    if (!queues.length) { emptyRow(body, 6, "No queue."); return; }
    body.replaceChildren(...queues.map((queue) => {
      const tr = document.createElement("tr");
      tr.dataset.queue = queue.name;
      const stateText = queue.paused ? `paused ${ago(queue.paused_at)}` : "running";
      const stateCell = cell(stateText, queue.paused ? "paused" : "");
      if (queue.paused && queue.paused_by) stateCell.title = `paused by ${queue.paused_by}`;
      const toggle = document.createElement("button");
      toggle.type = "button";
      toggle.className = queue.paused ? "resume" : "pause";
      toggle.textContent = queue.paused ? "Resume" : "Pause";
      toggle.setAttribute("aria-label", `${toggle.textContent} queue ${queue.name}`);
      toggle.addEventListener("click", () => setPaused(queue.name, !queue.paused, toggle));
      guard(toggle, OPERATE);
      tr.append(cell(queue.name), stateCell, cell(String(queue.counts.queued || 0)),
        cell(String(queue.counts.running || 0)), cell(String(queue.counts.dead || 0)), cell(toggle));
      return tr;
    }));
  }

  // --- flow limits ------------------------------------------------------------------------

  function describeLimit(limit) {
    const parts = [];
    if (limit.concurrency !== null) parts.push(`${limit.running}/${limit.concurrency} running`);
    if (limit.rate) parts.push(`${limit.started}/${limit.rate.limit} per ${limit.rate.period_s} s`);
    if (limit.per_key) parts.push("per key");
    return parts.join(", ");
  }

  function applyLimits(data) {
    const body = $("limits-body");
    if (!data.limits.length) { emptyRow(body, 3, "No limit."); return; }
    body.replaceChildren(...data.limits.map((limit) => {
      const tr = document.createElement("tr");
      tr.dataset.scope = limit.scope;
      tr.append(cell(limit.scope), cell(describeLimit(limit)),
        cell(String(limit.held), limit.held > 0 ? "held" : ""));
      return tr;
    }));
  }

  async function setPaused(name, paused, button) {
    if (button) button.disabled = true;
    const verb = paused ? "pause" : "resume";
    try {
      await api("POST", `/queues/${encodeURIComponent(name)}/${verb}`);
      notify(`Queue ${name} ${paused ? "paused" : "resumed"}.`);
      state.dirty.queues = true;
    } catch (err) {
      notify(`Could not ${verb} ${name}: ${err.message}`, "error");
      if (button) button.disabled = false;
    }
  }

  function setCount(stage, value) {
    const out = $(`count-${stage}`);
    const text = String(value);
    if (out.textContent === text) return;
    out.textContent = text;
    const item = out.closest(".stage");
    item.classList.add("bump");
    setTimeout(() => item.classList.remove("bump"), 600);
  }

  function renderPriorities(byPriority) {
    const list = $("priorities");
    const top = Math.max(1, ...byPriority);
    list.replaceChildren(...byPriority.map((n, level) => level).reverse().map((level) => {
      const n = byPriority[level];
      const li = document.createElement("li");
      li.setAttribute("aria-label", `priority ${level}: ${n} queued`);
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.className = "fill";
      fill.style.height = `${(100 * n) / top}%`;
      bar.append(fill);
      const count = document.createElement("strong");
      count.textContent = String(n);
      li.append(bar, count, document.createTextNode(`p${level}`));
      return li;
    }));
  }

  // --- workers ----------------------------------------------------------------------------

  function cell(content, className) {
    const td = document.createElement("td");
    if (className) td.className = className;
    if (content instanceof Node) td.append(content); else td.textContent = content ?? "";
    return td;
  }

  function jobLink(id) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link job-link";
    button.textContent = id.slice(0, 8);
    button.title = id;
    button.setAttribute("aria-label", `Open job ${id}`);
    button.addEventListener("click", () => openJob(id));
    return button;
  }

  function emptyRow(body, columns, text) {
    const tr = document.createElement("tr");
    const td = cell(text, "empty");
    td.colSpan = columns;
    tr.append(td);
    body.replaceChildren(tr);
  }

  function applyWorkers(data) {
    const body = $("workers-body");
    if (!data.workers.length) { emptyRow(body, 4, "No live worker."); return; }
    body.replaceChildren(...data.workers.map((w) => {
      const tr = document.createElement("tr");
      tr.dataset.worker = w.id;
      const name = document.createElement("span");
      name.textContent = `${w.hostname}:${w.pid}`;
      name.title = w.id;
      // Several processes share a host: which port this one's /metrics took (null: off).
      if (w.metrics_port) name.append(` · metrics :${w.metrics_port}`);
      // A pinned process (TASKLINE_WORKER_CPUS): the CPUs it runs on.
      if (w.cpus) name.append(` · CPU ${w.cpus.join(",")}`);
      const age = Number(w.heartbeat_age_s || 0);
      const beat = cell(`${age.toFixed(1)} s ago`, age > 10 ? "stale" : "");
      const meter = document.createElement("meter");
      meter.min = 0; meter.max = w.concurrency; meter.value = w.active_jobs;
      meter.setAttribute("aria-label", `${w.active_jobs} of ${w.concurrency} slots busy`);
      const busy = document.createElement("span");
      busy.append(meter, ` ${w.active_jobs}/${w.concurrency}`);
      const jobs = document.createElement("span");
      for (const id of w.job_ids.slice(0, 6)) jobs.append(jobLink(id), " ");
      if (w.job_ids.length > 6) jobs.append(`+${w.job_ids.length - 6}`);
      tr.append(cell(name), beat, cell(busy), cell(w.job_ids.length ? jobs : "idle"));
      return tr;
    }));
  }

  // --- workflows --------------------------------------------------------------------------

  function applyWorkflows(data) {
    const body = $("workflows-body");
    if (!data.workflows.length) { emptyRow(body, 5, "No workflow."); return; }
    body.replaceChildren(...data.workflows.map((wf) => {
      const tr = document.createElement("tr");
      tr.dataset.workflow = wf.id;
      // The list carries counts only (a 1,000-step workflow's steps are a page of their own).
      const steps = document.createElement("span");
      steps.className = "steps";
      // An any_failed step cancelled because every parent succeeded is not a cancellation of
      // the workflow: it is counted apart, under its cause.
      const unmet = wf.condition_unmet || 0;
      const counts = Object.entries(wf.step_counts)
        .map(([status, n]) => [status, status === "cancelled" ? n - unmet : n])
        .filter(([, n]) => n > 0).sort();
      if (unmet) counts.push(["condition_unmet", unmet]);
      for (const [status, n] of counts) {
        const count = document.createElement("span");
        count.append(`${n} `, badge(status));
        count.setAttribute("aria-label", `${n} ${n === 1 ? "step" : "steps"} ${status}`);
        steps.append(count);
      }
      const cancel = document.createElement("button");
      cancel.type = "button";
      cancel.textContent = "Cancel";
      cancel.setAttribute("aria-label", `Cancel workflow ${wf.name}`);
      cancel.addEventListener("click", () => cancelWorkflow(wf.id, cancel));
      guard(cancel, OPERATE);
      if (wf.status !== "running") cancel.disabled = true;
      tr.append(cell(wf.name), cell(badge(wf.status)), cell(steps), cell(ago(wf.created_at)),
        cell(cancel));
      return tr;
    }));
  }

  async function cancelWorkflow(id, button) {
    button.disabled = true;
    try {
      await api("DELETE", `/workflows/${id}`);
      notify(`Workflow ${id} cancelled.`);
      state.dirty.workflows = true;
    } catch (err) {
      notify(`Could not cancel workflow ${id}: ${err.message}`, "error");
      button.disabled = false;
    }
  }

  // --- dead jobs --------------------------------------------------------------------------

  function ago(iso) {
    const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (seconds < 90) return `${Math.round(seconds)} s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
    return new Date(iso).toLocaleString();
  }

  function applyDead(data) {
    const body = $("dead-body");
    if (!data.jobs.length) { emptyRow(body, 5, "No dead job."); return; }
    body.replaceChildren(...data.jobs.map((entry) => {
      const tr = document.createElement("tr");
      tr.dataset.job = entry.job.id;
      const requeue = document.createElement("button");
      requeue.type = "button";
      requeue.className = "requeue";
      requeue.textContent = "Requeue";
      requeue.setAttribute("aria-label", `Requeue job ${entry.job.id}`);
      requeue.addEventListener("click", () => requeueJob(entry.job.id, requeue));
      guard(requeue, OPERATE);
      tr.append(cell(jobLink(entry.job.id)), cell(entry.job.type),
        cell(entry.final_error, "error-text"), cell(ago(entry.failed_at)), cell(requeue));
      return tr;
    }));
  }

  function applyCauses(data) {
    const body = $("causes-body");
    if (!data.groups.length) { emptyRow(body, 6, "No dead job."); return; }
    body.replaceChildren(...data.groups.map((group) => {
      const tr = document.createElement("tr");
      tr.dataset.fingerprint = group.fingerprint || "";
      const actions = document.createElement("span");
      if (group.fingerprint) {
        for (const action of ["retry", "purge"]) {
          const button = document.createElement("button");
          button.type = "button";
          button.textContent = BULK[action].verb;
          if (action === "purge") button.className = "danger";
          button.setAttribute("aria-label", `${BULK[action].verb} the ${group.count} dead jobs of this cause`);
          button.addEventListener("click", () => askBulk(action, { fingerprint: group.fingerprint },
            `the cause "${group.sample_error || "no error"}"`));
          guard(button, OPERATE);
          actions.append(button);
        }
      }
      tr.append(cell(group.sample_error || "(no error)", "error-text"), cell(String(group.count)),
        cell(group.types.join(", ")), cell(group.queues.join(", ")), cell(ago(group.last_seen)),
        cell(actions));
      return tr;
    }));
  }

  async function requeueJob(id, button) {
    if (button) button.disabled = true;
    try {
      await api("POST", `/jobs/${id}/retry`);
      notify(`Job ${id} requeued.`);
      state.dirty.dead = state.dirty.causes = true;
      if (state.historyId === id) state.dirty.history = true;
    } catch (err) {
      notify(`Could not requeue ${id}: ${err.message}`, "error");
      if (button) button.disabled = false;
    }
  }

  async function cancelJob(id, button) {
    button.disabled = true;
    try {
      const data = await api("DELETE", `/jobs/${id}`);
      notify(data.status === "cancelled" ? `Job ${id} cancelled.` : `Job ${id} asked to stop.`);
      state.dirty.history = true;
    } catch (err) {
      notify(`Could not cancel ${id}: ${err.message}`, "error");
      button.disabled = false;
    }
  }

  // --- one job's history ------------------------------------------------------------------

  function openJob(id) {
    $("search-input").value = id;
    state.historyId = id;
    state.dirty.history = true;
    refresh("history").then(() => $("history").focus());
  }

  function onSearch(event) {
    event.preventDefault();
    const id = $("search-input").value.trim();
    if (id.startsWith("tag:")) {
      searchTag(id.slice(4).trim());
      return;
    }
    if (!UUID.test(id)) {
      $("history").replaceChildren(
        paragraph("A job id is a UUID, like 3f2b8c1e-…; tag:name finds jobs by tag", "error"));
      return;
    }
    openJob(id.toLowerCase());
  }

  // The newest jobs carrying a tag, each a button that opens its history.
  async function searchTag(tag) {
    state.historyId = null;
    const history = $("history");
    try {
      const data = await api("GET", `/jobs?tag=${encodeURIComponent(tag)}&limit=50`);
      if (!data.jobs.length) {
        history.replaceChildren(paragraph(`No job is tagged ${tag}.`));
        return;
      }
      const list = document.createElement("ul");
      list.className = "tagged";
      for (const job of data.jobs) {
        const item = document.createElement("li");
        item.dataset.job = job.id;
        const open = document.createElement("button");
        open.type = "button";
        open.textContent = job.id;
        open.addEventListener("click", () => openJob(job.id));
        item.append(open, " ", badge(job.status), ` ${job.type}`);
        list.append(item);
      }
      history.replaceChildren(paragraph(`Jobs tagged ${tag}, newest first:`), list);
    } catch (err) {
      history.replaceChildren(paragraph(`Could not search tag ${tag}: ${err.message}`, "error"));
    }
  }

  function paragraph(text, className) {
    const p = document.createElement("p");
    p.textContent = text;
    if (className) p.className = className;
    return p;
  }

  function badge(status) {
    const span = document.createElement("span");
    span.className = "badge";
    span.dataset.status = status;
    span.textContent = status;
    return span;
  }

  function summary(job) {
    const dl = document.createElement("dl");
    const rows = [
      ["Id", job.id], ["Status", badge(job.status)], ["Type", job.type], ["Queue", job.queue],
      ["Priority", String(job.priority)], ["Attempts", `${job.attempts} of ${job.max_retries + 1}`],
      ["Created", new Date(job.created_at).toLocaleString()],
    ];
    if (job.workflow_id) rows.push(["Workflow", `${job.workflow_id} (step ${job.step})`]);
    if (job.when && job.when !== "all_succeeded") rows.push(["Runs when", job.when]);
    if (job.unique_key) rows.push(["Unique key", job.unique_key]);
    if (job.debounce) {
      const joined = job.debounce.joined === 1 ? "1 payload" : `${job.debounce.joined} payloads`;
      rows.push(["Debounce", `${job.debounce.key} (${joined})`]);
    }
    if (job.ordering_key) rows.push(["Ordering key", job.ordering_key]);
    if (job.tags && job.tags.length) rows.push(["Tags", job.tags.join(", ")]);
    if (job.expires_at) rows.push(["Expires", new Date(job.expires_at).toLocaleString()]);
    if (job.progress !== null && job.progress !== undefined) {
      rows.push(["Progress", typeof job.progress === "number"
        ? `${Math.round(job.progress * 100)} %` : JSON.stringify(job.progress)]);
    }
    if (job.last_error) rows.push(["Last error", job.last_error]);
    if (job.result !== null && job.result !== undefined) rows.push(["Result", JSON.stringify(job.result)]);
    for (const [name, value] of rows) {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.append(value);
      dl.append(dt, dd);
    }
    return dl;
  }

  function eventsTable(events) {
    const table = document.createElement("table");
    table.className = "table history-events";
    const caption = document.createElement("caption");
    caption.className = "visually-hidden";
    caption.textContent = "Event history, oldest first";
    const head = document.createElement("thead");
    head.innerHTML = "<tr><th scope=\"col\">Time</th><th scope=\"col\">Event</th><th scope=\"col\">Attempt</th><th scope=\"col\">Worker</th><th scope=\"col\">By</th><th scope=\"col\">Detail</th></tr>";
    const body = document.createElement("tbody");
    for (const e of events) {
      const tr = document.createElement("tr");
      tr.dataset.event = e.event;
      // A cascade's or a condition's cancellation says why (cause: condition_unmet, ...);
      // a debounce join how many payloads the job holds.
      const detail = e.detail && (e.detail.error
        || (e.detail.joined !== undefined ? `${e.detail.joined} payloads` : "")
        || e.detail.status || e.detail.cause || "");
      tr.append(cell(clock(e.created_at)), cell(e.event),
        cell(String(e.attempt)), cell(e.worker_id || ""), cell(e.actor || ""),
        cell(detail || ""));
      body.append(tr);
    }
    table.append(caption, head, body);
    return table;
  }

  function jobActions(job) {
    const actions = document.createElement("div");
    actions.className = "actions";
    if (job.status === "dead") {
      const requeue = document.createElement("button");
      requeue.type = "button";
      requeue.textContent = "Requeue";
      requeue.addEventListener("click", () => requeueJob(job.id, requeue));
      actions.append(guard(requeue, OPERATE));
    }
    if (["scheduled", "waiting", "queued", "retrying", "running"].includes(job.status)) {
      const cancel = document.createElement("button");
      cancel.type = "button";
      cancel.textContent = job.status === "running" ? "Ask to stop" : "Cancel";
      cancel.addEventListener("click", () => cancelJob(job.id, cancel));
      actions.append(guard(cancel, OPERATE));
    }
    return actions;
  }

  function applyHistory(job) {
    $("history").replaceChildren(summary(job), jobActions(job), eventsTable(job.events));
  }

  // --- feed -------------------------------------------------------------------------------

  function renderFeed() {
    $("feed").replaceChildren(...state.feed.map((c) => {
      const li = document.createElement("li");
      const time = document.createElement("time");
      time.dateTime = c.created_at;
      time.textContent = clock(c.created_at);
      const where = c.worker_id ? ` on ${c.worker_id}` : (c.actor ? ` by ${c.actor}` : "");
      li.append(time, ` ${c.event.padEnd(15)} ${c.job_id.slice(0, 8)} ${c.type || ""}${where}`);
      if (c.error) li.title = c.error;
      return li;
    }));
  }

  function renderView() {
    $("count-succeeded").textContent = String(state.since.succeeded);
    $("count-cancelled").textContent = String(state.since.cancelled);
    renderFeed();
  }

  // --- flood ------------------------------------------------------------------------------

  function floodSpec(form) {
    const number = (name) => Number(form.elements[name].value);
    const spec = {
      count: Math.floor(number("count")), failure: number("failure") / 100,
      duration: number("duration") / 1000, retries: Math.floor(number("retries")),
      queue: form.elements.queue.value.trim(),
      weights: Object.entries(PRIORITIES).map(([name, level]) => [level, Math.max(0, number(name) || 0)]),
    };
    if (!(spec.count >= 1 && spec.count <= 100000)) return [null, "Jobs must be 1..100000."];
    if (!(spec.failure >= 0 && spec.failure <= 1)) return [null, "Failure rate must be 0..100 %."];
    if (!(spec.duration >= 0 && spec.duration <= 60)) return [null, "Duration must be 0..60000 ms."];
    if (!(spec.retries >= 0 && spec.retries <= 100)) return [null, "Retries must be 0..100."];
    if (!spec.queue) return [null, "A queue is required."];
    if (!spec.weights.some(([, w]) => w > 0)) return [null, "Give at least one priority a weight."];
    return [spec, ""];
  }

  function pickPriority(weights) {
    const total = weights.reduce((sum, [, w]) => sum + w, 0);
    let r = Math.random() * total;
    for (const [level, w] of weights) { r -= w; if (r < 0) return level; }
    return weights[weights.length - 1][0];
  }

  function floodJob(spec) {
    return {
      type: "simulate", queue: spec.queue, priority: pickPriority(spec.weights),
      max_retries: spec.retries,
      payload: { sleep_s: spec.duration, fail_rate: spec.failure, error: "flood: simulated failure" },
    };
  }

  async function onFlood(event) {
    event.preventDefault();
    const form = event.target;
    const status = $("flood-status");
    const [spec, problem] = floodSpec(form);
    if (!spec) { status.textContent = problem; return; }
    const button = $("flood-button");
    button.disabled = true;
    let sent = 0;
    try {
      while (sent < spec.count) {
        const size = Math.min(BATCH, spec.count - sent);
        const jobs = Array.from({ length: size }, () => floodJob(spec));
        await api("POST", "/jobs/batch", { jobs });
        sent += size;
        status.textContent = `Enqueued ${sent} of ${spec.count}…`;
      }
      status.textContent = `Enqueued ${sent} jobs.`;
    } catch (err) {
      status.textContent = `Stopped after ${sent} jobs: ${err.message}`;
    } finally {
      guard(button, WRITE);
    }
  }

  // --- bulk dead-letter operations --------------------------------------------------------

  const BULK = {
    retry: { verb: "Requeue", done: "requeued", what: "requeued with a fresh retry budget" },
    purge: { verb: "Purge", done: "purged", what: "deleted with their history, for good" },
  };

  function bulkFilter() {
    const filter = {};
    const queue = $("bulk-queue").value.trim();
    const type = $("bulk-type").value.trim();
    if (queue) filter.queue = queue;
    if (type) filter.type = type;
    return filter;
  }

  function describeFilter(filter, label) {
    if (label) return label;
    const parts = [];
    if (filter.queue) parts.push(`queue ${filter.queue}`);
    if (filter.type) parts.push(`type ${filter.type}`);
    return parts.join(" and ");
  }

  function askBulk(action, given, label) {
    const filter = given || bulkFilter();
    if (!filter.queue && !filter.type && !filter.fingerprint) {
      $("bulk-status").textContent = "Give a queue or a type first.";
      return;
    }
    const bulk = BULK[action];
    $("bulk-dialog-title").textContent = `${bulk.verb} matching dead jobs?`;
    $("bulk-question").textContent =
      `Every dead job of ${describeFilter(filter, label)} (at most 10,000) will be ${bulk.what}.`;
    $("bulk-confirm").textContent = bulk.verb;
    const dialog = $("bulk-dialog");
    dialog.returnValue = "";
    dialog.onclose = () => { if (dialog.returnValue === "confirm") runBulk(action, filter); };
    dialog.showModal();
  }

  async function runBulk(action, filter) {
    const status = $("bulk-status");
    const buttons = [$("bulk-requeue"), $("bulk-purge")];
    buttons.forEach((b) => { b.disabled = true; });
    status.textContent = `${BULK[action].verb}…`;
    try {
      const data = await api("POST", `/dlq/${action}`, filter);
      status.textContent = `${data[BULK[action].done]} ${BULK[action].done}, ${data.remaining} still matching.`;
      state.dirty.dead = state.dirty.causes = true;
      state.dirty.queues = true;
    } catch (err) {
      status.textContent = `${BULK[action].verb} failed: ${err.message}`;
    } finally {
      buttons.forEach((b) => guard(b, OPERATE));
    }
  }

  function startBulk() {
    for (const button of [$("bulk-requeue"), $("bulk-purge")]) {
      button.addEventListener("click", () => askBulk(button.dataset.action));
      guard(button, OPERATE);
    }
  }

  // --- schedules --------------------------------------------------------------------------

  function applySchedules(data) {
    const body = $("schedules-body");
    if (!data.schedules.length) { emptyRow(body, 5, "No schedule."); return; }
    body.replaceChildren(...data.schedules.map((s) => {
      const tr = document.createElement("tr");
      tr.dataset.schedule = s.name;
      const next = s.next_runs.length ? new Date(s.next_runs[0]).toLocaleString() : "–";
      const last = s.last_job_id ? jobLink(s.last_job_id) : "–";
      // A @periodic removed from the code keeps firing until deleted: say so where it is listed.
      const gone = s.declared_in_code === false;
      const stateText = (s.paused ? "paused" : "active") + (gone ? " · no longer in code" : "");
      tr.append(cell(s.name), cell(`${s.cron} (${s.timezone})`), cell(next, "next-run"),
        cell(last), cell(stateText, gone ? "undeclared" : (s.paused ? "paused" : "")));
      return tr;
    }));
  }

  // --- declared job types ------------------------------------------------------------------

  // The newest version's fields, `*` marking the required ones; "any" for an undeclared payload.
  function payloadFields(schema) {
    if (!schema || typeof schema !== "object") return "any";
    const required = new Set(schema.required || []);
    const names = Object.keys(schema.properties || {});
    return names.map((n) => (required.has(n) ? `${n}*` : n)).join(", ") || "(none)";
  }

  function applyTypes(data) {
    const body = $("types-body");
    if (!data.types.length) { emptyRow(body, 6, "No declared type."); return; }
    body.replaceChildren(...data.types.map((t) => {
      const tr = document.createElement("tr");
      tr.dataset.type = t.type;
      const versions = cell(String(t.schemas.length), t.schemas.length > 1 ? "stale" : "");
      // Two versions at once is a rolling deploy (or a forgotten old worker): both are accepted.
      if (t.schemas.length > 1) versions.title = "Workers declare different payload schemas";
      const workers = cell(String(t.workers.length));
      workers.title = t.workers.join("\n");
      tr.append(cell(t.type), cell(t.queue), cell(payloadFields(t.schema)), versions, workers,
        cell(clock(t.last_seen)));
      return tr;
    }));
  }

  // --- refresh loop -----------------------------------------------------------------------

  const SOURCES = {
    queues: { path: () => "/queues", apply: applyQueues, every: 5000, min: 1000 },
    workers: { path: () => "/workers", apply: applyWorkers, every: 3000, min: 1000 },
    dead: { path: () => "/dlq?limit=10", apply: applyDead, every: 10000, min: 1000 },
    causes: { path: () => "/dlq/groups?limit=10", apply: applyCauses, every: 10000, min: 1000 },
    workflows: { path: () => "/workflows?limit=10", apply: applyWorkflows, every: 5000, min: 1000 },
    limits: { path: () => "/limits", apply: applyLimits, every: 5000, min: 1000 },
    history: { path: () => `/jobs/${state.historyId}`, apply: applyHistory, every: 0, min: 500 },
    schedules: { path: () => "/schedules?limit=50", apply: applySchedules, every: 10000, min: 1000 },
    types: { path: () => "/types", apply: applyTypes, every: 15000, min: 1000 },
  };

  async function refresh(name) {
    const source = SOURCES[name];
    if (state.inflight[name] || (name === "history" && !state.historyId)) return;
    state.inflight[name] = true;
    state.dirty[name] = false;
    state.lastFetch[name] = Date.now();
    try {
      source.apply(await api("GET", source.path()));
    } catch (err) {
      if (name === "history" && err.status === 404) {
        $("history").replaceChildren(paragraph(`No job has the id ${state.historyId}.`, "error"));
        state.historyId = null;
      } else if (err.status !== 401) {
        notify(`Could not read ${name}: ${err.message}`, "error");
      }
    } finally {
      state.inflight[name] = false;
    }
  }

  function due(name, now) {
    const source = SOURCES[name];
    const since = now - state.lastFetch[name];
    if (state.dirty[name]) return since >= source.min;
    return source.every > 0 && since >= source.every;
  }

  function tick() {
    if ($("token-dialog").open || !can(READ)) return;
    const now = Date.now();
    for (const name of Object.keys(SOURCES)) {
      if (due(name, now)) refresh(name);
    }
    if (state.dirty.view) { state.dirty.view = false; renderView(); }
  }

  function markAllDirty() {
    for (const name of Object.keys(SOURCES)) state.dirty[name] = true;
    state.dirty.view = true;
  }

  function start() {
    $("token-form").addEventListener("submit", onTokenSubmit);
    $("token-button").addEventListener("click", () => askForToken(""));
    $("search-form").addEventListener("submit", onSearch);
    $("flood-form").addEventListener("submit", onFlood);
    guard($("flood-button"), WRITE);
    state.dirty.schedules = true;
    state.lastFetch.schedules = 0;
    state.dirty.types = true;
    state.lastFetch.types = 0;
    startBulk();
    renderPriorities(Array(10).fill(0));
    renderChart();
    begin();
    setInterval(tick, 250);
    setInterval(renderChart, 1000);
  }

  start();
})();
