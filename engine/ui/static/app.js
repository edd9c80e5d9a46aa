// vectorstep operator UI: live updates on top of pages that work without it.
// The run page follows GET /runs/{id}/events (Server-Sent Events) and redraws its
// header, timeline and steps from a fresh copy of the page; lists refresh every
// few seconds while nobody is typing in them.
"use strict";

(function () {
  function refreshParts(ids) {
    return fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        ids.forEach(function (id) {
          var now = document.getElementById(id);
          var next = fresh.getElementById(id);
          if (now && next) { now.replaceWith(document.importNode(next, true)); }
        });
        return fresh;
      })
      .catch(function () { /* the next event or tick tries again */ });
  }

  function busy(el) {
    var a = document.activeElement;
    return a && el && el.contains(a) && (a.tagName === "INPUT" || a.tagName === "SELECT");
  }

  function followRun(root) {
    var id = root.getAttribute("data-run");
    var last = parseInt(root.getAttribute("data-last-event") || "0", 10);
    var log = document.getElementById("log");
    var pending = null;
    var source = new EventSource("/runs/" + encodeURIComponent(id) + "/events?after=" + last);
    function redraw() {
      if (pending) { return; }
      pending = setTimeout(function () {
        pending = null;
        if (busy(document.getElementById("run-header"))) { return; }
        refreshParts(["run-header", "timeline-section", "steps"]);
      }, 150);
    }
    source.onmessage = function (m) {
      var e;
      try { e = JSON.parse(m.data); } catch (err) { return; }
      if (e.id <= last) { return; }
      last = e.id;
      var tr = document.createElement("tr");
      tr.className = "lvl-" + e.level;
      tr.setAttribute("data-id", String(e.id));
      [e.ts, e.level, e.event, e.msg].forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      if (log) { log.appendChild(tr); }
      redraw();
    };
    source.addEventListener("end", function () {
      source.close();
      refreshParts(["run-header", "timeline-section", "steps"]);
    });
  }

  function refreshEvery(containerId, ids, ms) {
    setInterval(function () {
      if (document.hidden || busy(document.getElementById(containerId))) { return; }
      refreshParts(ids);
    }, ms);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var run = document.getElementById("run");
    if (run && run.getAttribute("data-live") === "1") { followRun(run); }
    var runs = document.querySelector("table.runs[data-live]");
    if (runs) { refreshEvery("runs-body", ["runs-body", "counts"], 3000); }
    var approvals = document.getElementById("approvals");
    if (approvals && approvals.getAttribute("data-live") === "1") { refreshEvery("approvals", ["approvals"], 5000); }
  });
})();
