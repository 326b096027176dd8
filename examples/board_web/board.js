// The example board's page: plain JavaScript against a2trio's HTTP lanes.
//
//   push      POST /board/{id} {"events": [...]} or {"presence": {...}}
//   follow    GET  /board/{id}?presence=1&startAfter=N as an EventSource:
//             frames `event`, `presence`, `presence-snapshot` (docs/transport.md)
//
// The board and its last index live in localStorage, so a reload paints at
// once and resumes with startAfter instead of reading the whole log again;
// EventSource's own reconnects resume with Last-Event-ID.
"use strict";

const CONTRACT = "board";
// examples/board.py: PRESENCE_TTL_MS. Presence is refreshed well within it.
const PRESENCE_TTL_MS = 20000;
const HEARTBEAT_MS = 5000;
const CURSOR_EVERY_MS = 80;

const params = new URLSearchParams(location.search);
const boardId = params.get("board") || "team-1";
const base = `/${CONTRACT}/${encodeURIComponent(boardId)}`;
const cacheKey = `a2-board:${boardId}`;
const me = params.get("as") || sessionStorage.getItem("a2-board-me") || `viewer-${randomId(4)}`;
sessionStorage.setItem("a2-board-me", me);

const $ = (selector) => document.querySelector(selector);

// -- state ---------------------------------------------------------------------

// {last, lastId, tasks: {task_id: {title, points, index}}}
let state = loadState();
// participant -> {field: {value, at}}
let viewers = {};

function emptyState() {
  return { last: 0, lastId: null, tasks: {} };
}

function loadState() {
  try {
    const saved = JSON.parse(localStorage.getItem(cacheKey));
    if (saved && Number.isSafeInteger(saved.last) && saved.tasks) return saved;
  } catch (_) {
    // A damaged cache is dropped: the log is the truth.
  }
  return emptyState();
}

function saveState() {
  localStorage.setItem(cacheKey, JSON.stringify(state));
}

function randomId(bytes) {
  // crypto.randomUUID needs a secure context; getRandomValues does not.
  const data = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(data, (b) => b.toString(16).padStart(2, "0")).join("");
}

function apply(event) {
  if (event.index <= state.last) return; // already applied (a repaint)
  const p = event.payload;
  if (event.type === "task_added") {
    state.tasks[p.task_id] = { title: p.title, points: null, index: event.index };
  } else if (event.type === "task_removed") {
    delete state.tasks[p.task_id];
  } else if (event.type === "task_estimated" && state.tasks[p.task_id]) {
    state.tasks[p.task_id].points = p.points;
  }
  state.last = event.index;
  state.lastId = event.id;
  saveState();
}

function applyPresence(participant, values, at) {
  const fields = viewers[participant] || {};
  for (const [field, value] of Object.entries(values)) {
    if (value === null) delete fields[field];
    else fields[field] = { value, at };
  }
  if (Object.keys(fields).length) viewers[participant] = fields;
  else delete viewers[participant];
}

// -- the server ------------------------------------------------------------------

async function push(body) {
  const response = await fetch(base, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  if (!response.ok) {
    const envelope = await response.json().catch(() => null);
    showError(envelope ? `${envelope.error.code}: ${envelope.error.message}` : response.statusText);
  }
  return response.ok;
}

function addTask(title) {
  const taskId = randomId(8);
  return push({ events: [{ type: "task_added", payload: { task_id: taskId, title }, id: `add-${taskId}` }] });
}

function removeTask(taskId) {
  return push({ events: [{ type: "task_removed", payload: { task_id: taskId }, id: `remove-${taskId}` }] });
}

let presenceInFlight = false;
let pendingPresence = null;

async function sendPresence(values) {
  // One presence push in flight at a time; the latest values wait for it.
  pendingPresence = { ...(pendingPresence || {}), ...values };
  if (presenceInFlight) return;
  presenceInFlight = true;
  try {
    while (pendingPresence) {
      const next = pendingPresence;
      pendingPresence = null;
      await push({ presence: { participant: me, values: next, at: Date.now() } });
    }
  } finally {
    presenceInFlight = false;
  }
}

async function checkCache() {
  // A cache from another log (a memory store restarted, a board wiped) is
  // dropped: the event at the cached index must be the one we applied last.
  if (!state.last) return;
  const response = await fetch(`${base}?gte=${state.last}&lte=${state.last}`);
  const events = response.ok ? (await response.json()).events : [];
  if (!events.length || events[0].id !== state.lastId) {
    state = emptyState();
    saveState();
  }
}

function follow() {
  const resumedAfter = state.last;
  $("#resume").textContent = resumedAfter ? `resumed after event #${resumedAfter}` : "read from the start";
  const source = new EventSource(`${base}?presence=1&startAfter=${resumedAfter}`);
  source.onopen = () => setStatus("live", "live");
  source.addEventListener("event", (frame) => {
    apply(JSON.parse(frame.data));
    render();
  });
  source.addEventListener("presence-snapshot", (frame) => {
    viewers = {};
    for (const [participant, fields] of Object.entries(JSON.parse(frame.data).snapshot)) {
      for (const [field, entry] of Object.entries(fields)) {
        applyPresence(participant, { [field]: entry.value }, Date.parse(entry.at));
      }
    }
    renderPeople();
  });
  source.addEventListener("presence", (frame) => {
    const patch = JSON.parse(frame.data);
    applyPresence(patch.participant, patch.values, Date.parse(patch.at));
    renderPeople();
  });
  source.addEventListener("error", (frame) => {
    // A server `error` frame carries the envelope; a bare error is the
    // connection, which EventSource retries with Last-Event-ID.
    if (frame.data) showError(JSON.parse(frame.data).error.message);
    if (source.readyState === EventSource.CLOSED) setStatus("closed", "disconnected: reload");
    else setStatus("reconnecting", "reconnecting…");
  });
}

// -- the page ----------------------------------------------------------------------

function setStatus(state, text) {
  const status = $("#status");
  status.dataset.state = state;
  status.textContent = text;
}

function showError(message) {
  $("#error").textContent = message;
}

// Eight hues 45° apart, dark enough for white text on them. Each viewer
// prefers the hue its name hashes to; viewers whose names share one take the
// next free hue, in name order, so two viewers never look alike (up to eight)
// and every page agrees on who is which colour.
const HUES = [0, 45, 90, 135, 180, 225, 270, 315];

function hashOf(name) {
  let hash = 0;
  for (const ch of name) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return hash;
}

function coloursOf(names) {
  const colours = new Map();
  const taken = new Set();
  for (const name of [...names].sort()) {
    let slot = hashOf(name) % HUES.length;
    for (let tries = 0; tries < HUES.length && taken.has(slot); tries++) slot = (slot + 1) % HUES.length;
    taken.add(slot);
    colours.set(name, `hsl(${HUES[slot]} 70% 40%)`);
  }
  return colours;
}

function dot(colour) {
  const span = document.createElement("span");
  span.className = "dot";
  span.style.background = colour;
  return span;
}

function live(field) {
  // The render-time expiry guard (docs/presence.md): a viewer who left
  // without a word fades once its last write is older than the TTL.
  return field && Date.now() - field.at < PRESENCE_TTL_MS + 2000;
}

function render() {
  renderTasks();
  renderPeople();
}

function taskItem(taskId) {
  // Items are kept by task id and updated in place: a repaint never replaces
  // the button under a pointer that is about to click it.
  const item = document.createElement("li");
  item.dataset.taskId = taskId;
  const title = document.createElement("span");
  title.className = "title";
  const points = document.createElement("span");
  points.className = "points";
  const remove = document.createElement("button");
  remove.className = "remove";
  remove.type = "button";
  remove.title = "Remove";
  remove.textContent = "✕";
  remove.addEventListener("click", () => removeTask(taskId));
  item.append(title, points, remove);
  return item;
}

function renderTasks() {
  const list = $("#tasks");
  const items = new Map(Array.from(list.children, (item) => [item.dataset.taskId, item]));
  const tasks = Object.entries(state.tasks).sort((a, b) => a[1].index - b[1].index);
  tasks.forEach(([taskId, task], position) => {
    const item = items.get(taskId) || taskItem(taskId);
    items.delete(taskId);
    item.dataset.estimated = String(task.points !== null);
    item.querySelector(".title").textContent = task.title;
    item.querySelector(".points").textContent =
      task.points === null ? "estimating…" : `${task.points} pt${task.points === 1 ? "" : "s"}`;
    if (list.children[position] !== item) list.insertBefore(item, list.children[position] || null);
  });
  for (const gone of items.values()) gone.remove();
}

function renderPeople() {
  const people = Object.entries(viewers).filter(([, fields]) => live(fields.viewing) || live(fields.cursor));
  const colours = coloursOf(people.map(([participant]) => participant));
  $("#viewers").replaceChildren(
    ...people.map(([participant, fields]) => {
      const item = document.createElement("li");
      item.dataset.participant = participant;
      const name = document.createElement("span");
      name.textContent = participant === me ? `${participant} (you)` : participant;
      const where = document.createElement("span");
      where.className = "where";
      const viewing = live(fields.viewing) ? fields.viewing.value : "board";
      where.textContent = state.tasks[viewing] ? `on “${state.tasks[viewing].title}”` : "";
      item.append(dot(colours.get(participant)), name, where);
      return item;
    }),
  );
  const board = $("#board");
  const cursors = new Map(Array.from(board.querySelectorAll(".cursor"), (c) => [c.dataset.participant, c]));
  for (const [participant, fields] of people) {
    if (participant === me || !live(fields.cursor)) continue;
    let cursor = cursors.get(participant);
    cursors.delete(participant);
    if (!cursor) {
      cursor = document.createElement("div");
      cursor.className = "cursor";
      cursor.dataset.participant = participant;
      const name = document.createElement("span");
      name.className = "name";
      name.textContent = participant;
      cursor.append(dot(""), name);
      board.append(cursor);
    }
    const { x, y } = fields.cursor.value;
    cursor.style.left = `${x / 10}%`;
    cursor.style.top = `${y / 10}%`;
    // Past the middle the label sits left of the dot; near the bottom, above.
    cursor.toggleAttribute("data-flip-x", x > 500);
    cursor.toggleAttribute("data-flip-y", y > 900);
    // A newcomer can move someone to a free hue: colours are set each paint.
    const colour = colours.get(participant);
    cursor.querySelector(".dot").style.background = colour;
    cursor.querySelector(".name").style.background = colour;
  }
  for (const gone of cursors.values()) gone.remove();
}

function wire() {
  $("#board-name").textContent = boardId;
  document.title = `${boardId} · a2trio board`;
  $("#new-task").addEventListener("submit", async (submit) => {
    submit.preventDefault();
    const input = submit.target.elements.title;
    const title = input.value.trim();
    if (title && (await addTask(title))) input.value = "";
  });
  const board = $("#board");
  // At most one cursor push per CURSOR_EVERY_MS, always with the latest
  // position: the last move of a gesture is never dropped.
  let cursorTimer = null;
  let nextCursor = null;
  board.addEventListener("pointermove", (move) => {
    const rect = board.getBoundingClientRect();
    const x = Math.round(((move.clientX - rect.left) / rect.width) * 1000);
    const y = Math.round(((move.clientY - rect.top) / rect.height) * 1000);
    const task = move.target.closest("li[data-task-id]");
    nextCursor = {
      cursor: { x: Math.max(0, Math.min(1000, x)), y: Math.max(0, Math.min(1000, y)) },
      viewing: task ? task.dataset.taskId : "board",
    };
    if (cursorTimer === null) {
      cursorTimer = setTimeout(() => {
        cursorTimer = null;
        sendPresence(nextCursor);
      }, CURSOR_EVERY_MS);
    }
  });
  board.addEventListener("pointerleave", () => {
    clearTimeout(cursorTimer);
    cursorTimer = null;
    sendPresence({ cursor: null, viewing: "board" });
  });
  addEventListener("pagehide", () => {
    // The last word, even as the page goes away: sendBeacon outlives it.
    const bye = { presence: { participant: me, values: { viewing: null, cursor: null }, at: Date.now() } };
    navigator.sendBeacon(base, JSON.stringify(bye));
  });
  sendPresence({ viewing: "board" });
  setInterval(() => sendPresence({ viewing: (viewers[me] && viewers[me].viewing && viewers[me].viewing.value) || "board" }), HEARTBEAT_MS);
  // Repaint now and then so that the expiry guard takes silent viewers away.
  setInterval(renderPeople, 2000);
}

wire();
render();
checkCache().then(() => {
  render();
  follow();
});
