/* Conveyor dashboard: the little script that earns its place.
 *  - Live refresh: pages that ask for it (body[data-refresh]) re-fetch themselves and swap
 *    <main id="live">, keeping scroll; paused while a box is ticked, a field has focus or
 *    text is selected, and while the tab is hidden. The button in the header pauses it.
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

  function busy() {
    if (document.hidden) return true;
    var el = document.activeElement;
    if (el && /^(INPUT|SELECT|TEXTAREA|BUTTON)$/.test(el.tagName) && el.id !== "live-toggle") return true;
    if (document.querySelector('main input[type=checkbox]:checked')) return true;
    var sel = window.getSelection && window.getSelection();
    if (sel && String(sel).length) return true;
    return false;
  }

  function startRefresh() {
    var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
    var toggle = document.getElementById("live-toggle");
    if (!seconds || !window.fetch || !window.DOMParser) return;
    var paused = false;
    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.classList.toggle("paused", paused);
        toggle.textContent = paused ? "Paused" : "Live";
        toggle.setAttribute("aria-pressed", paused ? "true" : "false");
      });
    }
    var inflight = false;
    setInterval(function () {
      if (paused || inflight || busy()) return;
      inflight = true;
      fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "conveyor-refresh" }, redirect: "manual" })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById("live");
          var here = document.getElementById("live");
          if (!fresh || !here || busy()) return;
          here.replaceWith(document.importNode(fresh, true));
          var badge = doc.querySelector(".mainnav");
          var nav = document.querySelector(".mainnav");
          if (badge && nav) nav.replaceWith(document.importNode(badge, true));
          wireSelection(document);
          if (toggle) { toggle.classList.remove("stale"); toggle.title = "Updated " + new Date().toLocaleTimeString(); }
        })
        .catch(function () { if (toggle) { toggle.classList.add("stale"); toggle.title = "Refresh failed; retrying"; } })
        .then(function () { inflight = false; });
    }, seconds * 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    wireSelection(document);
    startRefresh();
  });
})();
