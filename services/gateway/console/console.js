// The agentstream web console: plain JavaScript, no framework, no build step, nothing fetched from elsewhere.
// Served by the gateway at /console/ (services/gateway/routes_console.py; docs/gateway.md, "Console").
// It is a client of the gateway's API like any other: the token entered once is kept in this tab's
// sessionStorage and sent as a bearer header, so the page can do what the token's role may and no more.
// Text that comes from the API is only ever set as text (textContent, text nodes), never parsed as HTML;
// the timeline, HTML the gateway draws, is shown in a sandboxed frame.
"use strict";

const TOKEN_KEY = "agentstream.token";
const TERMINAL = new Set(["completed", "failed"]);
const page = { who: null, controller: null, stops: [] };

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});

/** An element: el("a", {href: "#/runs"}, "Runs"). Children that are not nodes become text. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function time(iso) {
  return iso ? el("time", { datetime: iso }, new Date(iso).toLocaleString()) : "";
}

function badge(status) {
  return el("span", { class: `badge s-${status}` }, status.replace("_", " "));
}

function runLink(runId) {
  return el("a", { href: `#/runs/${enc(runId)}`, class: "mono" }, runId);
}

function notice(text) {
  $("notice").textContent = text;
}

function fail(target, error) {
  if (error.name === "AbortError" || error.status === 401) return;  // left the view; or signed out, said there
  $(target).textContent = error.message;
}

// -- the API ---------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Whether the token's role may: a reader reads, an approver also decides, a submitter also submits and
 *  cancels, an operator also browses and re-drives dead letters (docs/gateway.md, "Auth": a submitter does
 *  not approve, an operator neither approves nor submits). */
function can(role) {
  return page.who !== null && (role === "reader" || page.who.role === role);
}

async function problem(response) {
  let detail = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    detail = body.detail || body.title || detail;
  } catch (_) { /* not problem+json */ }
  return new ApiError(response.status, detail);
}

/** A call to the gateway with the token; JSON (or text) back, an ApiError with the problem's detail else. */
async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${token()}` };
  let body;
  if (options.body !== undefined) {
    body = JSON.stringify(options.body);
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, { method: options.method || "GET", headers, body, signal: options.signal });
  if (response.status === 401) {
    signOut("The gateway refused this token (unknown, malformed or revoked): enter another.");
    throw new ApiError(401, "unauthorized");
  }
  if (!response.ok) throw await problem(response);
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

/** The messages of a text/event-stream body: {id, event, data}. */
async function* eventStream(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let message = { data: [] };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        let line = buffer.slice(0, end);
        buffer = buffer.slice(end + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (message.data.length) yield { id: message.id, event: message.event || "message", data: message.data.join("\n") };
          message = { data: [] };
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? "" : line.slice(colon + 1);
          if (text.startsWith(" ")) text = text.slice(1);
          if (field === "data") message.data.push(text);
          else if (field === "event") message.event = text;
          else if (field === "id") message.id = text;
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// -- the token ---------------------------------------------------------------------------------------

function showSignIn(message) {
  hideViews();
  $("signin").hidden = false;
  $("signin-error").textContent = message || "";
  $("who").textContent = "";
  $("forget").hidden = true;
  $("token").focus();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  page.who = null;
  leaveView();
  showSignIn(message);
}

async function whoami() {
  page.who = await api("/v1/whoami");
  const who = page.who;
  $("who").textContent = `${who.name || who.token_id} · ${who.role} · tenant ${who.tenant}`;
  $("forget").hidden = false;
  document.body.dataset.role = who.role;
}

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const entered = $("token").value.trim();
  if (!entered) return;
  sessionStorage.setItem(TOKEN_KEY, entered);
  $("token").value = "";
  try {
    await whoami();
  } catch (error) {
    if (error.status !== 401) $("signin-error").textContent = error.message;
    return;
  }
  $("signin").hidden = true;
  notice("");
  route();
});

$("forget").addEventListener("click", () => signOut(""));

// -- views -------------------------------------------------------------------------------------------

function hideViews() {
  for (const view of document.querySelectorAll(".view")) view.hidden = true;
}

function leaveView() {
  if (page.controller) page.controller.abort();
  for (const stop of page.stops.splice(0)) stop();
}

function showView(id) {
  hideViews();
  const view = $(id);
  view.hidden = false;
  for (const node of view.querySelectorAll(".error")) node.textContent = "";
  return view;
}

/** Call fn every ms milliseconds while the view is shown (never two at once). */
function every(ms, fn, signal) {
  let timer = null;
  const tick = async () => {
    try {
      await fn();
    } catch (error) {
      if (error.status === 401) return;
    }
    if (!signal.aborted) timer = setTimeout(tick, ms);
  };
  timer = setTimeout(tick, ms);
  page.stops.push(() => clearTimeout(timer));
}

/** Replace a table's rows, unless they are what they were (a screen reader is not told of nothing new). */
function fill(tbody, rows, key) {
  if (tbody.dataset.key === key) return;
  tbody.dataset.key = key;
  tbody.replaceChildren(...rows);
}

// Runs -------------------------------------------------------------------------------------------------
const FILTERS = ["status", "agent", "session"];

async function showRuns(params, signal) {
  showView("view-runs");
  const form = $("runs-filter");
  const query = new URLSearchParams({ limit: "100" });
  for (const name of FILTERS) {
    form.elements[name].value = params.get(name) || "";
    if (params.get(name)) query.set(name, params.get(name));
  }
  const load = async () => {
    const { runs } = await api(`/v1/runs?${query}`, { signal });
    $("runs-count").textContent = String(runs.length);
    fill($("runs-table").tBodies[0], runs.map((run) => el("tr", { "data-run": run.run_id },
      el("td", {}, runLink(run.run_id)), el("td", {}, badge(run.status)), el("td", { class: "clip" }, run.task),
      el("td", {}, run.agent || ""), el("td", {}, run.session ? el("a", { href: `#/sessions/${enc(run.session)}` }, run.session) : ""),
      el("td", { class: "n" }, run.step_count), el("td", {}, time(run.submitted_at)))), JSON.stringify(runs));
    $("runs-error").textContent = "";
  };
  try {
    await load();
  } catch (error) {
    fail("runs-error", error);
  }
  every(3000, () => load().catch((error) => fail("runs-error", error)), signal);
}

$("runs-filter").addEventListener("submit", (event) => {
  event.preventDefault();
  const query = new URLSearchParams();
  for (const name of FILTERS) {
    const value = event.target.elements[name].value.trim();
    if (value) query.set(name, value);
  }
  const target = `#/runs${query.toString() ? `?${query}` : ""}`;
  if (location.hash === target) route();
  else location.hash = target;
});

// A run, live ------------------------------------------------------------------------------------------
function stepItem(live, runId, stepId, kind) {
  let item = live.steps.get(stepId);
  if (!item) {
    const index = stepId.startsWith(`${runId}:`) ? stepId.slice(runId.length + 1).split(":")[0] : stepId;
    item = el("li", { class: `step k-${kind}`, "data-step": stepId },
      el("p", { class: "step-head" }, el("span", { class: "step-kind" }, kind), " ", el("span", { class: "mono muted" }, `step ${index}`),
        " ", el("span", { class: "step-note" })),
      el("pre", { class: "tokens" }));
    live.steps.set(stepId, item);
    $("run-steps").append(item);
  }
  return item;
}

function setStatus(status) {
  $("run-status").replaceChildren(badge(status));
  $("run-approval").hidden = status !== "awaiting_approval";
  $("run-cancel").disabled = TERMINAL.has(status) || !can("submitter");
}

function setAnswer(outcome) {
  const box = $("run-answer");
  if (outcome.status === "completed") {
    box.replaceChildren(el("p", { class: "ok" }, outcome.answer ?? ""));
  } else {
    box.replaceChildren(el("p", { class: "bad" }, `${outcome.error_code || "failed"}: ${outcome.error || ""}`));
  }
}

/** A tool's result as the step carries it (JSON): a string result as its text, anything else as JSON. */
function shown(result) {
  if (result === null || result === undefined) return "";
  try {
    const value = JSON.parse(result);
    return typeof value === "string" ? value : result;
  } catch (_) {
    return result;
  }
}

function onEvent(live, runId, message) {
  const data = JSON.parse(message.data);
  if (message.event === "token") {
    const item = stepItem(live, runId, data.step_id, "model");
    item.querySelector(".tokens").append(document.createTextNode(data.text));
    item.classList.add("generating");
    live.tokens += 1;
    $("run-steps").dataset.tokens = String(live.tokens);
    $("run-live").textContent = `${live.tokens} tokens so far`;
  } else if (message.event === "step") {
    const item = stepItem(live, runId, data.step_id, data.kind);
    item.classList.remove("generating");
    item.classList.add("done");
    const note = item.querySelector(".step-note");
    const out = item.querySelector(".tokens");
    if (data.kind === "model") {
      if (!out.textContent && data.text) out.textContent = data.text;  // resumed past its tokens
      const calls = (data.tool_calls || []).map((c) => `${c.name}(${c.arguments})`).join(", ");
      note.textContent = [data.finish_reason, calls && `calls ${calls}`,
        data.completion_tokens != null && `${data.prompt_tokens}/${data.completion_tokens} tokens`].filter(Boolean).join(" · ");
    } else if (data.kind === "tool") {
      item.querySelector(".step-kind").textContent = `tool ${data.tool || ""}`;
      note.textContent = data.ok ? "ok" : `failed: ${data.error || ""}`;
      out.textContent = data.ok ? shown(data.result) : (data.error || "");
      if (!data.ok) item.classList.add("bad");
    } else {
      note.textContent = `${(data.passages || []).length} passages`;
      out.textContent = (data.passages || []).map((p) => `${p.score.toFixed(2)}  ${p.text}`).join("\n");
    }
  } else if (message.event === "outcome") {
    live.done = true;
    setStatus(data.status);
    setAnswer(data);
    $("run-live").textContent = `Ended ${data.status} after ${data.steps} steps, ${Math.round(data.duration_ms)} ms; ${live.tokens} tokens streamed.`;
    live.ended();
  }
}

/** Follow the run's events: fetch with the bearer header (an EventSource cannot set one), reconnecting
 *  with Last-Event-ID after a cut, as an EventSource would; the gateway resumes exactly after it. */
async function follow(runId, live, signal) {
  let last = null;
  while (!signal.aborted && !live.done) {
    const headers = { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" };
    if (last) headers["Last-Event-ID"] = last;
    let response;
    try {
      response = await fetch(`/v1/runs/${enc(runId)}/events`, { headers, signal });
    } catch (_) {
      await sleep(1000, signal);
      continue;
    }
    if (response.status === 204) return;  // read to its end already
    if (response.status === 401) {
      signOut("The gateway refused this token: enter another.");
      return;
    }
    if (!response.ok) {
      const error = await problem(response);
      $("run-error").textContent = error.message;
      if (response.status !== 429 && response.status !== 503) return;
      await sleep(Number(response.headers.get("Retry-After") || 2) * 1000, signal);
      continue;
    }
    $("run-live").textContent = last ? "Reconnected; following." : "Following the run.";
    try {
      for await (const message of eventStream(response.body)) {
        if (message.id) last = message.id;
        onEvent(live, runId, message);
      }
    } catch (_) { /* cut off: reconnect below */ }
    if (!live.done) await sleep(1000, signal);
  }
}

async function loadTimeline(runId, signal) {
  try {
    const html = await api(`/v1/runs/${enc(runId)}/timeline`, { signal });
    const frame = $("run-timeline");
    frame.srcdoc = html;
    frame.hidden = false;
  } catch (error) {
    fail("run-error", error);
  }
}

async function showRun(params, signal, runId) {
  showView("view-run");
  let ended = false;
  const end = () => {  // once, whichever sees it first: the stream's outcome or the run's status
    if (!ended) {
      ended = true;
      loadTimeline(runId, signal);
    }
  };
  const live = { steps: new Map(), tokens: 0, done: false, ended: end };
  $("run-id").textContent = runId;
  $("run-status").replaceChildren();
  $("run-task").textContent = "";
  $("run-answer").replaceChildren(el("span", { class: "muted" }, "not yet"));
  $("run-steps").replaceChildren();
  $("run-steps").dataset.tokens = "0";
  $("run-live").textContent = "";
  $("run-timeline").hidden = true;
  $("run-timeline").removeAttribute("srcdoc");
  $("run-approval").hidden = true;
  $("run-cancel").onclick = async () => {
    try {
      const answer = await api(`/v1/runs/${enc(runId)}/cancel`, { method: "POST", signal });
      notice(answer.status === "ended" ? `${runId} had already ended.` : `Cancelling ${runId}.`);
    } catch (error) {
      fail("run-error", error);
    }
  };
  $("run-timeline-load").onclick = () => loadTimeline(runId, signal);
  const refresh = async () => {
    const run = await api(`/v1/runs/${enc(runId)}`, { signal });
    $("run-task").textContent = run.task;
    if (!live.done) setStatus(run.status);
    if (TERMINAL.has(run.status) && !ended) {
      if (!live.done) setAnswer(run);
      end();
    }
  };
  try {
    await refresh();
  } catch (error) {
    fail("run-error", error);
    if (error.status === 404) return;
  }
  every(1500, async () => { if (!ended) await refresh(); }, signal);
  follow(runId, live, signal);
}

// Submit -----------------------------------------------------------------------------------------------
async function showSubmit() {
  showView("view-submit");
  const allowed = can("submitter");
  $("submit-form").querySelector("button[type=submit]").disabled = !allowed;
  if (!allowed) $("submit-error").textContent = `A ${page.who.role} token may not submit: that needs a submitter token.`;
}

$("submit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  const body = { task: form.elements.task.value, prefetch: form.elements.prefetch.checked };
  const tools = form.elements.tools.value.split(",").map((t) => t.trim()).filter(Boolean);
  if (tools.length) body.tools = tools;
  for (const name of ["agent", "session"]) {
    const value = form.elements[name].value.trim();
    if (value) body[name] = value;
  }
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  $("submit-error").textContent = "";
  try {
    const accepted = await api("/v1/runs", { method: "POST", body });
    notice(`Submitted ${accepted.run_id}.`);
    location.hash = `#/runs/${enc(accepted.run_id)}`;
  } catch (error) {
    fail("submit-error", error);
  } finally {
    button.disabled = false;
  }
});

// Approvals --------------------------------------------------------------------------------------------
function approvalRow(approval, signal) {
  const id = `${approval.run_id}/${approval.step_id}`;
  const reasonId = `reason-${approval.step_id.replace(/[^A-Za-z0-9_-]/g, "-")}`;
  const what = `${approval.tool || "the call"} in ${approval.run_id}`;
  const decide = async (verb) => {
    try {
      const decision = await api(`/v1/approvals/${enc(approval.run_id)}/${enc(approval.step_id)}/${verb}`,
        { method: "POST", body: { reason: $(reasonId).value }, signal });
      const held = decision.approved ? "approved" : "denied";
      notice(decision.as_asked ? `${what}: ${held} by ${decision.decided_by}.`
        : `${what}: an earlier decision stands (${held} by ${decision.decided_by}).`);
      row.remove();
    } catch (error) {
      fail("approvals-error", error);
    }
  };
  const allowed = can("approver");
  const why = allowed ? null : "An approver token decides";
  const row = el("tr", { "data-approval": id },
    el("td", {}, runLink(approval.run_id), el("br"), el("span", { class: "mono muted" }, approval.step_id)),
    el("td", {}, approval.tool || ""),
    el("td", {}, el("pre", { class: "args" }, JSON.stringify(approval.arguments, null, 2))),
    el("td", {}, time(approval.since)),
    el("td", {}, el("label", { for: reasonId, class: "visually-hidden" }, `Reason for ${what}`),
      el("input", { id: reasonId, maxlength: 1000 })),
    el("td", { class: "decide" },
      el("button", { type: "button", class: "approve", disabled: !allowed, title: why, "aria-label": `Approve ${what}`,
        onclick: () => decide("approve") }, "Approve"), " ",
      el("button", { type: "button", class: "deny", disabled: !allowed, title: why, "aria-label": `Deny ${what}`,
        onclick: () => decide("deny") }, "Deny")));
  return row;
}

async function showApprovals(params, signal) {
  showView("view-approvals");
  const tbody = $("approvals-table").tBodies[0];
  tbody.replaceChildren();
  const load = async () => {
    const { approvals } = await api("/v1/approvals", { signal });
    const keys = new Set(approvals.map((a) => `${a.run_id}/${a.step_id}`));
    for (const row of [...tbody.rows]) if (!keys.has(row.dataset.approval)) row.remove();  // decided elsewhere
    const shown = new Set([...tbody.rows].map((row) => row.dataset.approval));
    for (const approval of approvals) {  // rows stay as they are: a reason being typed is kept
      if (!shown.has(`${approval.run_id}/${approval.step_id}`)) tbody.append(approvalRow(approval, signal));
    }
    $("approvals-count").textContent = String(tbody.rows.length);
    const note = can("approver") ? "" : `A ${page.who.role} token sees the calls; an approver token decides.`;
    if ($("approvals-error").textContent !== note) $("approvals-error").textContent = note;  // not announced again
  };
  try {
    await load();
  } catch (error) {
    fail("approvals-error", error);
  }
  every(2000, () => load().catch((error) => fail("approvals-error", error)), signal);
}

// Sessions ---------------------------------------------------------------------------------------------
async function showSessions(params, signal) {
  showView("view-sessions");
  try {
    const { sessions } = await api("/v1/sessions?limit=100", { signal });
    fill($("sessions-table").tBodies[0], sessions.map((s) => el("tr", {},
      el("td", {}, el("a", { href: `#/sessions/${enc(s.session_id)}`, class: "mono" }, s.session_id)),
      el("td", { class: "n" }, s.turns), el("td", { class: "n" }, s.tokens),
      el("td", {}, s.last_run_id ? runLink(s.last_run_id) : ""), el("td", {}, time(s.updated_at)))), JSON.stringify(sessions));
  } catch (error) {
    fail("sessions-error", error);
  }
}

async function showSession(params, signal, sessionId) {
  showView("view-session");
  $("session-id").textContent = sessionId;
  $("session-turns").replaceChildren();
  $("session-going").replaceChildren();
  $("session-meta").textContent = "";
  $("session-summary").hidden = true;
  $("session-runs").href = `#/runs?session=${enc(sessionId)}`;
  try {
    const s = await api(`/v1/sessions/${enc(sessionId)}`, { signal });
    $("session-meta").textContent = `${s.turns} turns (${s.dropped} dropped), ${s.tokens} tokens; updated `
      + new Date(s.updated_at).toLocaleString() + (s.deleted_at ? "; deleted before" : "");
    if (s.summary) {
      $("session-summary").textContent = `Summary of earlier turns: ${s.summary}`;
      $("session-summary").hidden = false;
    }
    $("session-turns").replaceChildren(...s.transcript.map((turn) => el("li", {},
      el("p", {}, el("strong", {}, "User: "), turn.user ?? ""),
      el("p", {}, el("strong", {}, "Answer: "), turn.answer ?? turn.reply ?? ""),
      turn.run_id ? el("p", { class: "muted" }, runLink(turn.run_id)) : "")));
    $("session-going").replaceChildren(...(s.going.length ? s.going.map((t) => el("li", {}, runLink(t.run_id), " ", badge(t.status)))
      : [el("li", { class: "muted" }, "none")]));
  } catch (error) {
    fail("session-error", error);
  }
}

// Dead letters (an operator token's) -------------------------------------------------------------------
const DLQ_FILTERS = ["kind", "source_topic"];
const OPERATOR_ONLY = "Dead letters are an operator token's (agentstream token create --role operator).";

async function showDeadLetters(params, signal) {
  showView("view-dead-letters");
  const form = $("dlq-filter");
  const query = new URLSearchParams({ limit: "200" });
  for (const name of DLQ_FILTERS) {
    form.elements[name].value = params.get(name) || "";
    if (params.get(name)) query.set(name, params.get(name));
  }
  if (!can("operator")) {
    $("dlq-table").tBodies[0].replaceChildren();
    $("dlq-error").textContent = `A ${page.who.role} token does not see them. ${OPERATOR_ONLY}`;
    return;
  }
  try {
    const { letters } = await api(`/v1/dead-letters?${query}`, { signal });
    $("dlq-count").textContent = String(letters.length);
    fill($("dlq-table").tBodies[0], letters.map((l) => el("tr", { "data-letter": l.offset },
      el("td", {}, el("a", { href: `#/dead-letters/${l.offset}`, class: "mono" }, String(l.offset))),
      el("td", {}, time(l.time)),
      el("td", { class: "mono" }, l.source_topic ? `${l.source_topic}[${l.source_partition}]@${l.source_offset}` : ""),
      el("td", {}, l.consumer || ""), el("td", {}, l.error_kind || "?"),
      el("td", { class: "clip" }, l.reason || l.problem || ""),
      el("td", {}, l.run_id ? runLink(l.run_id) : ""), el("td", { class: "n" }, l.redrives || ""))),
    JSON.stringify(letters));
  } catch (error) {
    fail("dlq-error", error);
  }
}

$("dlq-filter").addEventListener("submit", (event) => {
  event.preventDefault();
  const query = new URLSearchParams();
  for (const name of DLQ_FILTERS) {
    const value = event.target.elements[name].value.trim();
    if (value) query.set(name, value);
  }
  const target = `#/dead-letters${query.toString() ? `?${query}` : ""}`;
  if (location.hash === target) route();
  else location.hash = target;
});

const LETTER_FIELDS = ["source_topic", "source_partition", "source_offset", "consumer", "error_kind", "reason",
  "run_id", "step_id", "event_id", "time", "producer", "instance", "key", "value_size", "value_kept",
  "truncated", "value_preview", "original_problem", "problem", "redrive_of", "redrives"];

async function showDeadLetter(params, signal, offset) {
  showView("view-dead-letter");
  $("letter-id").textContent = offset;
  $("letter-fields").tBodies[0].replaceChildren();
  $("letter-original").textContent = "";
  $("letter-result").textContent = "";
  const button = $("letter-redrive");
  button.disabled = !can("operator");
  if (!can("operator")) {
    $("letter-error").textContent = `A ${page.who.role} token does not see them. ${OPERATOR_ONLY}`;
    return;
  }
  try {
    const letter = await api(`/v1/dead-letters/${enc(offset)}`, { signal });
    const rows = LETTER_FIELDS.filter((name) => letter[name] !== null && letter[name] !== undefined)
      .map((name) => el("tr", {}, el("th", { scope: "row" }, name), el("td", { class: "mono" }, String(letter[name]))));
    for (const row of letter.redrive_history) {
      rows.push(el("tr", {}, el("th", { scope: "row" }, "re-driven"), el("td", { class: "mono" },
        `${row.redriven_at} by ${row.redriven_by}: ${row.status} → ${row.source_topic}[${row.source_partition}]@${row.target_offset}`)));
    }
    $("letter-fields").tBodies[0].replaceChildren(...rows);
    $("letter-original").textContent = letter.original
      ? `${letter.original_type}\n${JSON.stringify(letter.original, null, 2)}` : (letter.original_problem || "none");
    button.disabled = !letter.source_topic;
  } catch (error) {
    fail("letter-error", error);
  }
}

$("letter-redrive").addEventListener("click", async () => {
  const offset = $("letter-id").textContent;
  const button = $("letter-redrive");
  button.disabled = true;
  $("letter-error").textContent = "";
  try {
    const result = await api(`/v1/dead-letters/${enc(offset)}/redrive`, { method: "POST",
      body: { force: $("letter-force").checked, dry_run: $("letter-dry-run").checked } });
    $("letter-result").textContent = `${result.action.replace("_", " ")}: ${result.detail}`;
    $("letter-result").dataset.action = result.action;
    notice(`Dead letter ${offset}: ${result.action.replace("_", " ")}.`);
  } catch (error) {
    fail("letter-error", error);
  } finally {
    button.disabled = false;
  }
});

// -- the router -------------------------------------------------------------------------------------

const ROUTES = [
  [/^\/runs$/, showRuns], [/^\/runs\/([^/]+)$/, showRun], [/^\/submit$/, showSubmit],
  [/^\/approvals$/, showApprovals], [/^\/sessions$/, showSessions], [/^\/sessions\/([^/]+)$/, showSession],
  [/^\/dead-letters$/, showDeadLetters], [/^\/dead-letters\/(\d+)$/, showDeadLetter],
];

async function route() {
  const hash = location.hash;
  if (!hash) {
    location.replace("#/runs");  // (comes back here through hashchange)
    return;
  }
  if (!hash.startsWith("#/")) return;  // an anchor in the page (the skip link)
  leaveView();
  if (!token()) {
    showSignIn("");
    return;
  }
  if (page.who === null) {
    try {
      await whoami();
    } catch (error) {
      if (error.status !== 401) notice(error.message);
      return;
    }
  }
  const controller = page.controller = new AbortController();
  const [path, query] = hash.slice(1).split("?");
  for (const link of document.querySelectorAll("nav a")) {
    const here = path === link.getAttribute("href").slice(1) || path.startsWith(`${link.getAttribute("href").slice(1)}/`);
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  for (const [pattern, view] of ROUTES) {
    const match = path.match(pattern);
    if (match) {
      await view(new URLSearchParams(query || ""), controller.signal, ...match.slice(1).map(decodeURIComponent));
      return;
    }
  }
  location.replace("#/runs");
}

window.addEventListener("hashchange", route);
route();
