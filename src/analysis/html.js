"use strict";
// The report page: a table drawn from #tasks-data, filtered and sorted by the URL fragment
// (#status=..&stop=..&q=..&sort=..&desc=1&task=ID), so a link or a headless browser can set
// them; a task's conversation is parsed from its own script element only when opened.
// Run data is only ever set as textContent.
(function () {
  const MAX_ROWS = 1000;
  const MAX_META_KEYS = 10, MAX_META_VALUES = 100;
  const FOLD_CHARS = 2000, FOLD_LINES = 20;
  const rows = JSON.parse(document.getElementById("tasks-data").textContent);
  const index = new Map(rows.map((r, i) => [r.id, i]));
  const st = {};
  const $ = (id) => document.getElementById(id);
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    for (const k of ["status", "stop", "q", "task"]) st[k] = p.get(k) || "";
    st.meta = {};
    for (const [k, v] of p) if (k.startsWith("m.") && v) st.meta[k.slice(2)] = v;
    st.sort = p.get("sort") || "id";
    st.desc = p.get("desc") === "1";
  }
  function setHash(change) {
    Object.assign(st, change);
    const p = new URLSearchParams();
    for (const k of ["status", "stop", "q", "task"]) if (st[k]) p.set(k, st[k]);
    for (const [k, v] of Object.entries(st.meta)) if (v) p.set("m." + k, v);
    if (st.sort !== "id") p.set("sort", st.sort);
    if (st.desc) p.set("desc", "1");
    location.hash = p.toString();
  }
  function options(sel, values) {
    const seen = [...new Set(values)].sort();
    for (const v of seen) {
      const o = el("option", "", v === "" ? "(none)" : v);
      o.value = v;
      sel.appendChild(o);
    }
  }
  function cmp(a, b) {
    const x = a[st.sort], y = b[st.sort];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
  }
  function drawTable() {
    $("f-status").value = st.status;
    $("f-stop").value = st.stop;
    if ($("f-q").value !== st.q) $("f-q").value = st.q;
    for (const [k, sel] of metaSelects) sel.value = st.meta[k] || "";
    const q = st.q.toLowerCase();
    const meta = Object.entries(st.meta);
    const hit = rows.filter((r) =>
      (!st.status || r.status === st.status) &&
      (!st.stop || r.stop === st.stop) &&
      meta.every(([k, v]) => r.meta && r.meta[k] === v) &&
      (!q || [r.id, r.status, r.stop, r.answer, r.error, r.shard, ...Object.values(r.meta || {})]
        .some((s) => String(s).toLowerCase().includes(q))));
    hit.sort((a, b) => (st.desc ? -cmp(a, b) : cmp(a, b)));
    const body = el("tbody");
    for (const r of hit.slice(0, MAX_ROWS)) {
      const tr = el("tr", "s-" + r.status + (r.flip ? " flip" : "") + (r.id === st.task ? " open" : ""));
      tr.dataset.id = r.id;
      const a = el("a", "", r.id);
      a.href = "#task=" + encodeURIComponent(r.id);
      const td = el("td");
      td.appendChild(a);
      tr.appendChild(td);
      const cost = r.cost === null ? "" : "$" + r.cost.toFixed(4);
      for (const v of [r.status, r.stop, r.turns, r.tools, r.tokens, r.secs, r.attempts, cost, r.flip]) tr.appendChild(el("td", "", v));
      body.appendChild(tr);
    }
    $("task-table").replaceChild(body, $("task-table").tBodies[0]);
    const more = hit.length > MAX_ROWS ? " (first " + MAX_ROWS + " shown; filter to see the rest)" : "";
    $("shown").textContent = hit.length + " of " + rows.length + " tasks" + more;
    for (const th of document.querySelectorAll("#task-table th")) {
      th.classList.toggle("sorted", th.dataset.k === st.sort);
      th.classList.toggle("desc", th.dataset.k === st.sort && st.desc);
    }
  }
  function textBlock(parent, label, t, foldable) {
    if (!t || (!t.text && !t.cut)) return;
    const pre = el("pre", "", t.text);
    const lines = t.text.split("\n").length;
    if (foldable) {
      const d = el("details");
      d.open = t.text.length <= FOLD_CHARS && lines <= FOLD_LINES && !t.cut;
      d.appendChild(el("summary", "", label + " (" + lines + " lines)"));
      d.appendChild(pre);
      parent.appendChild(d);
    } else {
      if (label) parent.appendChild(el("div", "label", label));
      parent.appendChild(pre);
    }
    if (t.cut) parent.appendChild(el("div", "cut", "… " + t.cut + " more bytes not shown"));
  }
  function conversation(c) {
    const box = el("div", "conversation");
    if (c.error) box.appendChild(el("p", "cut", c.error));
    let attempt = null;
    for (const it of c.items || []) {
      if (it.attempt !== attempt) {
        attempt = it.attempt;
        box.appendChild(el("h3", "attempt", "attempt " + attempt));
      }
      const turn = el("div", "turn " + it.source);
      const who = { user: "instruction", agent: "model", system: "note" }[it.source] || it.source;
      turn.appendChild(el("div", "label", who + (it.tokens ? " · " + it.tokens[0] + " in / " + it.tokens[1] + " out" : "")));
      textBlock(turn, "reasoning", it.reasoning, true);
      textBlock(turn, "", it.message, false);
      for (const call of it.calls || []) {
        const cd = el("div", "call" + (call.is_error ? " is-error" : ""));
        cd.appendChild(el("div", "label", "tool call: " + call.name + (call.is_error ? " (error)" : "")));
        textBlock(cd, "arguments", call.arguments, true);
        if (call.output) textBlock(cd, "output", call.output, true);
        else cd.appendChild(el("div", "cut", "no output recorded"));
        turn.appendChild(cd);
      }
      box.appendChild(turn);
    }
    if (c.dropped) box.appendChild(el("p", "cut", "… " + c.dropped + " more steps not shown"));
    return box;
  }
  function verdict(v) {
    const d = el("div", "verdict" + (v.status === "passed" ? "" : " not-passed"));
    d.appendChild(el("div", "label", "verdict"));
    d.appendChild(el("div", "", v.status + " / " + v.stop_reason + " · attempts " + v.attempts));
    textBlock(d, "answer", v.answer, false);
    if (v.error) textBlock(d, "error", v.error, false);
    if (v.verify) {
      const how = v.verify.timed_out ? "timed out" : "exit " + v.verify.exit_code;
      textBlock(d, "verify (" + how + ")", v.verify.output_tail, false);
    }
    return d;
  }
  function drawTask() {
    const sec = $("transcript");
    sec.replaceChildren();
    const i = index.get(st.task);
    if (!st.task || i === undefined) { sec.hidden = true; return; }
    sec.hidden = false;
    const r = rows[i];
    sec.appendChild(el("h2", "", "Task " + r.id));
    if (r.flip) sec.appendChild(el("p", "", "verdict flipped: " + r.flip));
    const c = JSON.parse($("tr-" + i).textContent);
    if (c.verdict) sec.appendChild(verdict(c.verdict));
    const cols = el("div", "cols");
    const side = (title, conv) => {
      const col = el("div", "col");
      col.appendChild(el("h3", "", title));
      if (conv.verdict) col.appendChild(verdict(conv.verdict));
      col.appendChild(conversation(conv));
      cols.appendChild(col);
    };
    if (r.base) {
      side("this run", c);
      side("baseline", JSON.parse($("bt-" + i).textContent));
    } else {
      cols.appendChild(conversation(c));
    }
    sec.appendChild(cols);
  }
  function draw() { readHash(); drawTable(); drawTask(); }
  options($("f-status"), rows.map((r) => r.status));
  options($("f-stop"), rows.map((r) => r.stop));
  // A filter for each metadata key the tasks carry, when its values are few enough to list.
  const metaSelects = new Map();
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r.meta || {})))].sort();
  for (const k of keys.slice(0, MAX_META_KEYS)) {
    const values = rows.map((r) => (r.meta || {})[k]).filter((v) => v !== undefined);
    if (new Set(values).size > MAX_META_VALUES) continue;
    const label = el("label", "", k + " ");
    const sel = el("select");
    sel.id = "f-m-" + metaSelects.size;
    sel.appendChild(el("option", "", "all")).value = "";
    options(sel, values);
    sel.addEventListener("change", (e) => setHash({ meta: { ...st.meta, [k]: e.target.value } }));
    label.appendChild(sel);
    $("filters").insertBefore(label, $("shown"));
    metaSelects.set(k, sel);
  }
  $("f-status").addEventListener("change", (e) => setHash({ status: e.target.value }));
  $("f-stop").addEventListener("change", (e) => setHash({ stop: e.target.value }));
  $("f-q").addEventListener("change", (e) => setHash({ q: e.target.value }));
  for (const th of document.querySelectorAll("#task-table th")) {
    th.addEventListener("click", () => setHash({ sort: th.dataset.k, desc: st.sort === th.dataset.k ? !st.desc : false }));
  }
  window.addEventListener("hashchange", draw);
  draw();
})();
