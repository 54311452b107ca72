/* Conveyor dashboard: the little script that earns its place.
 *  - Live refresh: pages that ask for it (body[data-refresh], bounded here) re-fetch their own
 *    URL (same filter, same page) and swap <main id="live">, keeping scroll. Held while a box
 *    is ticked, a field has focus or an unsubmitted change, text is selected, a dialog or
 *    [data-hold-refresh] is open, or the pointer moved over the page in the last moments (a
 *    click never lands on a row that just moved); no request at all while the tab is hidden,
 *    backing off on failures. The button in the header pauses it.
 *  - Bulk selection on the dead-letter page: "select all" and the selected count.
 * Everything works without it: forms post, confirmations are pages, reload refreshes.
 * No inline script anywhere (the Content-Security-Policy forbids it) and no innerHTML of
 * anything but this dashboard's own server-rendered, escaped HTML. */
(function () {
  "use strict";

  function wireSelection(root) {
    root.querySelectorAll("form").forEach(function (form) {
      var boxes = form.querySelectorAll('input[type=checkbox][name=ids]');
      if (!boxes.length) return;
      var all = form.querySelector("input.select-all");
      var needs = form.querySelectorAll("[data-needs-selection]");
      var counter = form.querySelector(".selection-count");
      function update() {
        var n = 0;
        boxes.forEach(function (b) { if (b.checked) n++; });
        needs.forEach(function (btn) { btn.disabled = n === 0; });
        if (counter) counter.textContent = n ? n + " selected" : "Tick jobs to act on them";
        if (all) { all.checked = n === boxes.length; all.indeterminate = n > 0 && n < boxes.length; }
      }
      if (all) all.addEventListener("change", function () {
        boxes.forEach(function (b) { b.checked = all.checked; });
        update();
      });
      boxes.forEach(function (b) { b.addEventListener("change", update); });
      update();
    });
  }

  // Refresh intervals are bounded whatever a page asks; failures back off up to the cap.
  var MIN_SECONDS = 1, MAX_SECONDS = 300, MAX_BACKOFF_SECONDS = 60;
  // A swap waits this long after the pointer last moved or pressed over the page, so a click
  // aimed at a row never lands on the row that moved into its place.
  var POINTER_QUIET_MS = 1500;
  var pointerAt = 0, pointerDown = false;

  function intervalOf(doc) {
    var s = parseInt((doc.body && doc.body.getAttribute("data-refresh")) || "0", 10);
    if (!s || s < 0) return 0;
    return Math.min(MAX_SECONDS, Math.max(MIN_SECONDS, s));
  }

  function edited(root) {
    // A field changed and not submitted yet (a filter being chosen): a swap would undo it.
    var fields = root.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "hidden" || f.type === "submit" || f.type === "button") continue;
      if (f.tagName === "SELECT") {
        var initial = 0;  // a select with no option marked selected starts on its first
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].defaultSelected) { initial = j; break; }
        }
        if (!f.multiple && f.options.length && f.selectedIndex !== initial) return true;
      } else if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function busy() {
    if (document.hidden) return true;
    var el = document.activeElement;
    if (el && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(el.tagName) && el.id !== "live-toggle") return true;
    if (document.querySelector('main input[type=checkbox]:checked')) return true;
    // A confirmation or panel open in the page (a <dialog>, or anything marked to hold it).
    if (document.querySelector("dialog[open], [data-hold-refresh]")) return true;
    var sel = window.getSelection && window.getSelection();
    if (sel && String(sel).length) return true;
    if (pointerDown || Date.now() - pointerAt < POINTER_QUIET_MS) return true;
    var live = document.getElementById("live");
    return !!(live && edited(live));
  }

  var TIME_RE = /<time\b[^>]*>[^<]*<\/time>/g;

  function withoutTimes(el) { return el.innerHTML.replace(TIME_RE, ""); }

  // What the server last sent for <main id="live">, relative times left out. Compared with
  // that, not with the page: the script itself changes the page (disabled buttons, counts).
  var shown = null;

  function swap(here, fresh) {
    var key = withoutTimes(fresh);
    // Only relative times changed ("5 s ago"): update them in place, move nothing.
    if (key === shown) {
      var old = here.querySelectorAll("time"), neu = fresh.querySelectorAll("time");
      for (var i = 0; i < old.length && i < neu.length; i++) {
        if (old[i].textContent !== neu[i].textContent) old[i].textContent = neu[i].textContent;
      }
      return;
    }
    // Keep the tracebacks the reader opened or closed, when the page still has the same ones.
    var was = here.querySelectorAll("details"), now = fresh.querySelectorAll("details");
    if (was.length === now.length) {
      for (var k = 0; k < was.length; k++) now[k].open = was[k].open;
    }
    here.replaceWith(document.importNode(fresh, true));
    shown = key;
    wireSelection(document);
  }

  function startRefresh() {
    var seconds = intervalOf(document);
    var toggle = document.getElementById("live-toggle");
    if (!seconds || !window.fetch || !window.DOMParser) return;
    var paused = false, inflight = false, failures = 0, timer = null;

    function schedule(ms) {
      if (timer) clearTimeout(timer);
      timer = setTimeout(tick, ms);
    }
    function later() {
      var ms = seconds * 1000;
      return failures ? Math.min(ms * Math.pow(2, failures), MAX_BACKOFF_SECONDS * 1000) : ms;
    }
    function stale(why) {
      if (toggle) { toggle.classList.add("stale"); toggle.title = why; }
    }
    function apply(html) {
      var doc = new DOMParser().parseFromString(html, "text/html");
      var fresh = doc.getElementById("live");
      var here = document.getElementById("live");
      if (!fresh || !here) return true;
      if (busy()) return false;
      seconds = intervalOf(doc) || seconds;  // a job that finished asks less often
      swap(here, fresh);
      var nav = doc.querySelector(".mainnav"), ours = document.querySelector(".mainnav");
      if (nav && ours && nav.innerHTML !== ours.innerHTML) ours.replaceWith(document.importNode(nav, true));
      var foot = doc.querySelector(".foot"), ourFoot = document.querySelector(".foot");
      if (foot && ourFoot) ourFoot.textContent = foot.textContent;
      if (doc.title) document.title = doc.title;
      document.documentElement.setAttribute("data-updated", String(Date.now()));
      if (toggle) { toggle.classList.remove("stale"); toggle.title = "Updated " + new Date().toLocaleTimeString(); }
      return true;
    }
    function tick() {
      timer = null;
      // A hidden tab asks nothing at all; becoming visible again refreshes at once.
      if (paused || document.hidden) return;
      if (inflight) { schedule(later()); return; }
      if (busy()) { schedule(Math.min(1000, seconds * 1000)); return; }
      inflight = true;
      var retrySoon = false;
      fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "conveyor-refresh" }, redirect: "manual", cache: "no-store" })
        .then(function (r) {
          if (r.type === "opaqueredirect" || r.status === 401) throw new Error("login");
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (html) { failures = 0; retrySoon = !apply(html); })
        .catch(function (err) {
          failures++;
          stale(err && err.message === "login" ? "Logged out: reload the page to log in again" : "Refresh failed; retrying");
        })
        .then(function () {
          inflight = false;
          schedule(retrySoon ? 1000 : later());
        });
    }

    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.classList.toggle("paused", paused);
        toggle.textContent = paused ? "Paused" : "Live";
        toggle.setAttribute("aria-pressed", paused ? "true" : "false");
        if (paused) { if (timer) clearTimeout(timer); timer = null; } else { schedule(250); }
      });
    }
    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && !paused && !timer && !inflight) schedule(250);
    });
    document.addEventListener("pointermove", function (e) { if (e.target.closest && e.target.closest("#live")) pointerAt = Date.now(); });
    document.addEventListener("pointerdown", function () { pointerDown = true; pointerAt = Date.now(); });
    document.addEventListener("pointerup", function () { pointerDown = false; pointerAt = Date.now(); });
    document.addEventListener("pointercancel", function () { pointerDown = false; });
    schedule(later());
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.getElementById("live");
    if (live) shown = withoutTimes(live);  // before wireSelection changes it
    wireSelection(document);
    startRefresh();
  });
})();
