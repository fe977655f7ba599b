// segack ui: asks /api/state every few seconds and redraws the page; rates come from the last
// samples of the counts (the checkpoint holds counts, not rates). Unless the page is read-only, its
// controls POST to api/split, api/merge, api/scale and api/release with the page's CSRF token and
// show the server's one-line answer. Every request but the page's own carries the page's token as a
// bearer token: it comes in the address's fragment (#token=...), which no request carries, and is
// kept in this tab's sessionStorage, which no page of another port or site can read.
"use strict";

const REFRESH_MS = 2000;
// Seconds of samples a rate is measured over.
const RATE_WINDOW = 15;
// Seconds the samples of a rate must span: reads a moment apart (a headless browser's virtual time
// runs the page's timer in milliseconds) would show a rate of nothing at all.
const RATE_SPAN = 1.5;
const samples = [];
const CONTROLS = document.querySelector('meta[name="segack-controls"]') !== null;
// Given with the state (a read-only page has none).
let csrf = null;
const TOKEN_KEY = "segack-token";

// `headers` with the page's token as a bearer token, its UTF-8 bytes as a header carries them.
function authorized(headers) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token === null) return headers;
  return {...headers, Authorization: `Bearer ${String.fromCharCode(...new TextEncoder().encode(token))}`};
}

const $ = (id) => document.getElementById(id);

(function keepToken() {
  const found = /(?:^|&)token=(.*)$/.exec(location.hash.slice(1));
  if (found) {
    // Each run of %XX escapes is UTF-8 (as printed, or as the browser wrote what was typed: a blank,
    // a letter that is not ASCII); a % that starts no escape is the token's own, typed by hand.
    const token = found[1].replace(/(?:%[0-9A-Fa-f]{2})+/g, (run) => {
      try {
        return decodeURIComponent(run);
      } catch (error) {
        return run;
      }
    });
    sessionStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname + location.search);
  }
  // A link cannot carry a bearer token: say how the metrics are read instead.
  if (sessionStorage.getItem(TOKEN_KEY) !== null) {
    $("metrics").textContent = "Prometheus metrics at /metrics, with the token as a bearer token";
  }
})();

const number = (value) => value == null ? "?" : value.toLocaleString("en-US");
const counted = (value, noun) => `${number(value)} ${noun}${value === 1 ? "" : "s"}`;
// A time as `segack status` prints it, whatever the browser's locale: local, to the second.
function when(seconds) {
  if (seconds == null) return "?";
  const at = new Date(seconds * 1000), two = (n) => String(n).padStart(2, "0");
  return `${at.getFullYear()}-${two(at.getMonth() + 1)}-${two(at.getDate())} ` +
    `${two(at.getHours())}:${two(at.getMinutes())}:${two(at.getSeconds())}`;
}

function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "?";
  seconds = Math.round(seconds);
  const h = Math.floor(seconds / 3600), m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
  return h ? `${h} h ${m} min` : m ? `${m} min ${s} s` : `${s} s`;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

// Events a second over the samples of the last RATE_WINDOW seconds, for a count picked by `pick`.
function rate(pick) {
  const recent = samples.filter((sample) => sample.at >= samples[samples.length - 1].at - RATE_WINDOW);
  if (recent.length < 2) return null;
  const first = recent[0], last = recent[recent.length - 1];
  const before = pick(first.state), now = pick(last.state);
  if (before == null || now == null || now < before || last.at - first.at < RATE_SPAN) return null;
  return (now - before) / (last.at - first.at);
}

const STATES = {
  running: "running", interrupted: "stopped before its end (killed, or its machine lost): the next run resumes it",
  stopped: "stopped, its progress saved: the next run resumes it",
  failed: "stopped: its last run failed; the next run resumes it",
  dead_letters_left: "not complete: dead letters left", complete: "complete",
};

// Asks the server for a control, shows its answer (or why it refused), then reads the state again.
async function ask(action, body) {
  const message = $("control-message");
  message.hidden = false;
  if (!csrf) {
    message.textContent = `${action}: the page has not read the checkpoint yet; press it again`;
    message.className = "refused";
    return;
  }
  message.className = "";
  message.textContent = `${action}: asking…`;
  try {
    const response = await fetch(`api/${action}`, {
      method: "POST", cache: "no-store", body: JSON.stringify(body),
      headers: authorized({"Content-Type": "application/json", "X-Segack-CSRF": csrf}),
    });
    const said = (await response.text()).trim();
    message.textContent = response.ok ? said : `refused (${response.status}): ${said}`;
    message.className = response.ok ? "answered" : "refused";
  } catch (error) {
    message.textContent = `${action}: no answer: ${error.message}`;
    message.className = "refused";
  }
  refresh();
}

function button(label, title, action) {
  const element = document.createElement("button");
  element.className = `control ${label}`;
  element.textContent = label;
  element.title = title;
  element.addEventListener("click", action);
  return element;
}

function drawHeader(state) {
  const line = $("state");
  line.textContent = `${state.kind}: ${STATES[state.state] || state.state}`;
  line.className = `state ${state.state}`;
  const claim = state.claim;
  $("claim").textContent = !claim ? "never claimed"
    : claim.live ? `held by ${claim.owner} since ${when(claim.claimed_at)}, extended ` +
      `${duration(state.at - claim.extended_at)} ago (timeout ${claim.timeout} s)`
    : `free: last held by ${claim.owner}` + (state.updated_at ? `, saved ${when(state.updated_at)}` : "");
  if (CONTROLS) $("release").hidden = !claim || claim.released;
  const requested = state.requested;
  $("requested").hidden = !requested;
  if (requested) {
    $("requested").textContent = requested.segments == null ? requested.why
      : `asked: ${requested.why} -> ${counted(requested.segments, "segment")}, ${when(requested.requested_at)} ` +
        `by ${requested.by}; the run applies it within seconds`;
  }
}

function drawEvents(state) {
  const events = state.events, total = events.total;
  // A stream has no end, so no bar; a replay's is empty until its total is counted.
  $("done-bar").parentElement.hidden = state.kind !== "replay";
  $("done-bar").style.width = total ? `${Math.min(100, 100 * events.done / total)}%` : "0";
  const aside = events.dead_letters ? `, ${number(events.dead_letters)} set aside as dead letters` : "";
  $("events").textContent = total != null
    ? `${number(events.done)} of ${number(total)} done (${(100 * events.done / Math.max(total, 1)).toFixed(1)}%): ` +
      `${number(events.handled)} handled${aside}`
    : `${number(events.done)} done: ${number(events.handled)} handled${aside}` +
      (state.kind === "replay" ? " (the total is counted once a run has read its input to the end)" : "");
  const perSecond = rate((s) => s.events.done);
  const parts = [];
  if (perSecond != null && state.claim && state.claim.live) {
    parts.push(`${number(Math.round(perSecond))} events/s`);
    if (total != null && perSecond > 0) parts.push(`about ${duration((total - events.done) / perSecond)} left`);
  }
  if (state.claim && state.claim.live) {
    parts.push(`${number(events.in_flight)} handler calls in flight, ${number(events.pending)} events pending`);
  }
  if (events.retries) parts.push(`${counted(events.retries, "call")} made again after raising`);
  $("rate").textContent = parts.join("; ");
}

function drawStream(state) {
  const stream = state.stream;
  $("stream-section").hidden = !stream;
  if (!stream) return;
  const last = stream.last_batch || {};
  let line = stream.real_time ? `real-time: each partition's progress saved every ${stream.commit_interval} s`
    : stream.completed_batch < 0 ? "no micro-batch complete yet"
    : `micro-batch ${stream.completed_batch} the last complete`;
  if (last.seconds != null) line += `; micro-batch ${last.id} took ${last.seconds.toFixed(1)} s`;
  if (stream.in_progress != null) line += `; micro-batch ${stream.in_progress} in progress`;
  if (stream.group) line += `; offsets committed to consumer group ${stream.group}`;
  if (stream.ends_at != null) line += `; end offsets read from Kafka ${duration(Math.max(state.at - stream.ends_at, 0))} ago`;
  $("stream").textContent = line;
  const body = $("partitions").tBodies[0];
  body.replaceChildren();
  $("partitions").hidden = !stream.partitions.length;
  // Records pending are a real-time task's; a micro-batch has none between batches.
  $("pending-head").hidden = !stream.real_time;
  for (const where of stream.partitions) {
    const row = body.insertRow();
    cell(row, where.topic);
    cell(row, where.partition, "number");
    cell(row, number(where.next_offset), "number");
    cell(row, number(where.committed), "number");
    cell(row, number(where.end_offset), "number");
    cell(row, number(where.lag), "number");
    if (stream.real_time) {
      cell(row, number(where.pending) + (where.holds_back ? " (holds the run back)" : ""), "number");
    }
  }
}

function drawSegments(state) {
  const running = state.claim && state.claim.live;
  const stream = state.stream, scope = $("segments-scope");
  // A micro-batch stream's key groups count one micro-batch at a time, not the stream's events.
  scope.hidden = state.kind !== "stream" || !stream || (stream.in_progress == null && stream.completed_batch < 0);
  if (!scope.hidden) {
    scope.textContent = stream.in_progress != null
      ? `events and done: micro-batch ${stream.in_progress}'s, in progress`
      : `events and done: micro-batch ${stream.completed_batch}'s, the last complete`;
  }
  const body = $("segments").tBodies[0];
  body.replaceChildren();
  const total = state.segments.reduce((sum, segment) => sum + (segment.load || 0), 0);
  // The busiest cell is full height: a cell's height is its load, its shade its progress.
  const busiest = Math.max(1, ...state.strips.flat().map(([done, count]) => count == null ? done : count));
  state.segments.forEach((segment, index) => {
    const row = body.insertRow();
    row.dataset.segment = segment.segment_id;
    cell(row, `#${segment.position}`);
    cell(row, segment.segment_id, "number");
    cell(row, segment.mask, "number");
    cell(row, number(segment.key_groups), "number");
    cell(row, number(segment.load), "number");
    cell(row, segment.load == null ? "?" : `${(100 * segment.load / Math.max(total, 1)).toFixed(1)}%`, "number");
    cell(row, segment.busiest == null ? "?" : number(segment.busiest), "number");
    cell(row, number(segment.done), "number");
    const perSecond = running ? rate((s) => {
      const same = s.segments.find((other) => other.segment_id === segment.segment_id && other.mask === segment.mask);
      return same ? same.done : null;
    }) : null;
    cell(row, perSecond == null ? "" : `${number(Math.round(perSecond))}/s`, "number");
    const strip = document.createElement("div");
    strip.className = "strip";
    for (const [done, count] of state.strips[index] || []) {
      const square = document.createElement("span");
      if (count === 0) {
        square.className = "empty";  // key groups without events
        square.title = "no events";
      } else {
        const share = count ? done / count : done > 0 ? 1 : 0;
        square.style.opacity = (0.15 + 0.85 * share).toFixed(2);
        square.style.height = `${Math.max(3, Math.round(14 * (count == null ? done : count) / busiest))}px`;
        square.title = `${number(done)} done` + (count != null ? ` of ${number(count)}` : "");
      }
      strip.appendChild(square);
    }
    row.insertCell().appendChild(strip);
    if (CONTROLS) {
      const change = row.insertCell();
      change.className = "change";
      const id = segment.segment_id;
      change.appendChild(button("split", `split segment ${id} in two`, () => ask("split", {segment_id: id})));
      if (segment.mergeable) {
        change.appendChild(button("merge", `merge segment ${id} with its sibling`,
          () => ask("merge", {segment_id: id})));
      }
    }
  });
  const hottest = state.hottest_key_group;
  $("hottest").hidden = !hottest;
  if (hottest) {
    $("hottest").textContent = `The busiest key group (#${hottest.key_group}) holds ` +
      `${number(hottest.events)} events, ${(100 * hottest.share).toFixed(1)}% of them: a segment holds whole ` +
      "key groups, so no set of segments gives one a smaller share (segack plan measures the keys themselves).";
  }
  const history = $("history");
  history.replaceChildren();
  for (const entry of state.history.slice().reverse()) {
    const item = document.createElement("li");
    item.textContent = `${when(entry.at)}: ${entry.segments} segments, ${entry.why}`;
    if (entry.layout) item.appendChild(drawLayout(entry.layout));
    history.appendChild(item);
  }
}

// A segment set as the hash space cut by its splits: one block per segment, as wide as its share,
// coloured by its id, so that a split shows as a block cut in two and a merge as two joined.
function drawLayout(layout) {
  const bar = document.createElement("div");
  bar.className = "layout";
  for (const [id, start, share] of layout) {
    const block = document.createElement("span");
    block.style.left = `${100 * start}%`;
    block.style.width = `${100 * share}%`;
    block.style.background = `hsl(${(id * 137.508) % 360}, 55%, 72%)`;
    block.title = `segment ${id}: ${(100 * share).toFixed(share < 0.01 ? 3 : 1)}% of the hash space`;
    if (share >= 0.04) block.textContent = id;
    bar.appendChild(block);
  }
  return bar;
}

function drawDeadLetters(state) {
  const letters = state.dead_letters;
  $("dead-summary").textContent = letters.events
    ? `${counted(letters.events, "event")} of ${counted(letters.keys, "key")} set aside` +
      (letters.keys > letters.shown.length ? ` (the ${letters.shown.length} keys with most here; ` +
        "segack dead-letters lists them all)" : "")
    : "none";
  $("dead-filter").hidden = $("dead-letters").hidden = !letters.shown.length;
  const filter = $("dead-filter").value.toLowerCase();
  const body = $("dead-letters").tBodies[0];
  body.replaceChildren();
  for (const letter of letters.shown) {
    if (filter && !`${letter.key} ${letter.error}`.toLowerCase().includes(filter)) continue;
    const row = body.insertRow();
    cell(row, letter.key);
    cell(row, number(letter.events), "number");
    cell(row, letter.error + (letter.attempts > 1 ? ` (${letter.attempts} attempts)` : ""));
  }
}

let latest = null;

function draw(state) {
  $("where").textContent = state.checkpoint;
  document.title = `segack · ${state.checkpoint}`;
  if (!state.exists) {
    $("state").textContent = "no checkpoint here yet: a run makes one";
    return;
  }
  drawHeader(state);
  drawEvents(state);
  drawStream(state);
  // A real-time stream's tasks own Kafka partitions: it has no segments.
  const segmented = state.kind !== "real-time";
  $("segments-section").hidden = !segmented;
  $("segment-sets-section").hidden = !segmented;
  if (segmented) drawSegments(state);
  drawDeadLetters(state);
  $("updated").textContent = `read ${when(state.at).slice(11)}`;
}

// After this many answers missed in a row the page stops asking: a server gone may be followed on its
// port by another process, which would be sent the token.
const MISSES = 5;
let missed = 0;
let polling = null;

function stopAsking(why) {
  clearInterval(polling);
  $("updated").textContent = `${why}: the page stopped asking; open its address again once segack ui runs`;
}

async function refresh() {
  try {
    const response = await fetch("api/state", {cache: "no-store", headers: authorized({})});
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    let state;
    try {
      state = await response.json();
    } catch {  // another process took the port: it is sent the token no more
      stopAsking("the address answered, but not as segack ui");
      return;
    }
    missed = 0;
    latest = state;
    csrf = latest.csrf || null;
    if (latest.exists) {
      samples.push({at: latest.at, state: latest});
      while (samples.length > 60) samples.shift();
    }
    draw(latest);
  } catch (error) {
    $("updated").textContent = `could not read the checkpoint: ${error.message}`;
    if (error instanceof TypeError && ++missed >= MISSES) {  // no answer at all, not a refusal
      stopAsking(`the server did not answer ${MISSES} times`);
    }
  }
}

$("dead-filter").addEventListener("input", () => latest && draw(latest));
if (CONTROLS) {
  $("release").addEventListener("click", () => {
    const claim = latest && latest.claim;
    if (!claim) return;
    const live = claim.live ? "It is live: release it only if that run is gone. " : "";
    if (confirm(`Release the claim of ${claim.owner}? ${live}Should it come back, it is fenced.`)) {
      ask("release", {claim: claim.number, force: Boolean(claim.live)});
    }
  });
  $("scale-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const to = $("scale-to").value.trim();
    const segments = /^\d+$/.test(to) ? Number(to)
      : /^\d+(\s*,\s*\d+)+$/.test(to) ? to.split(",").map(Number) : to;
    ask("scale", {segments});
  });
}
refresh();
polling = setInterval(refresh, REFRESH_MS);
