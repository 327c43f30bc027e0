// Live updates of django-fq's dashboard and job list (django_fq/admin/live.py).
//
// The page's live bar (#fq-live, hidden without JavaScript) names a JSON view;
// this polls it every few seconds and rewrites the counts in place. Polling
// stops while paused (the button; remembered in localStorage across reloads),
// slows down while the tab is hidden, and backs off after errors. Only text
// and attributes are set (never HTML from the answer).
(function () {
  "use strict";

  var PAUSE_KEY = "django_fq.live.paused";
  var HIDDEN_MS = 60000;   // one poll a minute while the tab is hidden
  var MAX_BACKOFF_MS = 60000;

  function storedPaused() {
    try { return window.localStorage.getItem(PAUSE_KEY) === "1"; } catch (e) { return false; }
  }

  function storePaused(paused) {
    try { window.localStorage.setItem(PAUSE_KEY, paused ? "1" : "0"); } catch (e) { /* private mode: this page only */ }
  }

  function setCount(cell, n, href, alert) {
    // A non-zero count links to the job list, as the server renders it; dead counts stand out.
    var old = cell.textContent.trim();
    var text = String(n);
    if (old === text) { return false; }
    while (cell.firstChild) { cell.removeChild(cell.firstChild); }
    if (n && href) {
      var a = document.createElement("a");
      a.href = href;
      if (alert) { a.className = "fq-alert"; }
      a.textContent = text;
      cell.appendChild(a);
    } else if (n && alert) {
      var span = document.createElement("span");
      span.className = "fq-alert";
      span.textContent = text;
      cell.appendChild(span);
    } else {
      cell.textContent = text;
    }
    cell.classList.remove("fq-changed");
    void cell.offsetWidth; // restart the highlight
    cell.classList.add("fq-changed");
    return true;
  }

  function setText(el, text) {
    if (!el || el.textContent === text) { return false; }
    el.textContent = text;
    el.classList.remove("fq-changed");
    void el.offsetWidth;
    el.classList.add("fq-changed");
    return true;
  }

  // --- the dashboard ------------------------------------------------------------------------

  function updateDashboard(data) {
    var changes = [];
    var missing = 0;
    var rows = {};
    document.querySelectorAll("#fq-queue-table tr.fq-queue-row").forEach(function (tr) {
      rows[tr.getAttribute("data-queue")] = tr;
    });
    data.queues.forEach(function (q) {
      var tr = rows[q.name];
      if (!tr) { missing += 1; return; }
      Object.keys(q.counts).forEach(function (state) {
        var cell = tr.querySelector("td.fq-count-" + state);
        var before = cell ? cell.textContent.trim() : null;
        var href = q.jobs_url + "&state=" + encodeURIComponent(state);
        if (cell && setCount(cell, q.counts[state], href, state === "dead")) {
          changes.push(q.name + " " + state + " " + q.counts[state] + " (was " + before + ")");
        }
      });
      setText(tr.querySelector("td.fq-enqueued"), String(q.enqueued));
      setText(tr.querySelector("td.fq-acked"), String(q.acked));
      var failed = tr.querySelector("td.fq-failed");
      if (failed) { setCount(failed, q.failed, null, true); }
      setText(tr.querySelector("td.fq-avg-wait"), q.avg_wait);
      setText(tr.querySelector("td.fq-avg-run"), q.avg_run);
      var head = tr.querySelector("th");
      var mark = head && head.querySelector(".fq-paused");
      if (q.paused && head && !mark) {
        mark = document.createElement("span");
        mark.className = "fq-paused";
        head.appendChild(document.createTextNode(" "));
        head.appendChild(mark);
        mark.textContent = "paused";
        changes.push(q.name + " paused");
      } else if (!q.paused && mark) {
        mark.parentNode.removeChild(mark);
        changes.push(q.name + " resumed");
      }
      if (mark && q.paused) { mark.title = "since " + q.paused_at; }
    });
    Object.keys(data.all).forEach(function (state) {
      setText(document.querySelector("#fq-queue-table tfoot td.fq-total-" + state), String(data.all[state]));
    });
    setText(document.getElementById("fq-db-time"), data.now_text);
    var said = "";
    if (changes.length) {
      said = "Changed: " + changes.slice(0, 3).join("; ") + (changes.length > 3 ? "; and " + (changes.length - 3) + " more." : ".");
    }
    if (missing) {
      said += (said ? " " : "") + missing + " more queue" + (missing === 1 ? " is" : "s are") + " now among the busiest: reload to list " + (missing === 1 ? "it" : "them") + ".";
    }
    return said;
  }

  // --- the job list ---------------------------------------------------------------------------

  var ROW_ID = /\/([0-9]+)\/change\/(?:\?|$)/;

  function listedRows() {
    var rows = {};
    document.querySelectorAll("#result_list tbody tr").forEach(function (tr) {
      var link = tr.querySelector("th a");
      var m = link && ROW_ID.exec(link.getAttribute("href") || "");
      if (m) { rows[m[1]] = tr; }
    });
    return rows;
  }

  function jobsQuery(bar) {
    var params = new URLSearchParams(window.location.search);
    params.delete("p");
    params.delete("e");
    params.set("live_rows", Object.keys(listedRows()).join(","));
    if (bar.getAttribute("data-since")) { params.set("live_since", bar.getAttribute("data-since")); }
    if (!params.get("live_rows")) { params.delete("live_rows"); }
    return params.toString();
  }

  function updateJobs(data) {
    var changes = [];
    var rows = listedRows();
    Object.keys(rows).forEach(function (seq) {
      var tr = rows[seq];
      var row = data.rows[seq];
      if (!row) {
        if (!tr.classList.contains("fq-gone")) { tr.classList.add("fq-gone"); tr.title = "this job is gone (deleted or pruned)"; changes.push("a job is gone"); }
        return;
      }
      var badge = tr.querySelector("td.field-state_badge .fq-state");
      if (badge && badge.textContent !== row.state) {
        changes.push("job " + tr.querySelector("th a").textContent + " is " + row.state);
        badge.className = "fq-state fq-state-" + row.state;
        setText(badge, row.state);
      }
      setText(tr.querySelector("td.field-attempts_of"), row.attempts);
      setText(tr.querySelector("td.field-worker"), row.worker || "-");
      tr.classList.toggle("fq-stale", !row.matches);
      if (!row.matches) { tr.title = "no longer matches the filters"; } else if (!tr.classList.contains("fq-gone")) { tr.removeAttribute("title"); }
    });
    var link = document.getElementById("fq-live-new");
    if (link) {
      if (data.new) {
        var params = new URLSearchParams(window.location.search);
        params.delete("p");
        var text = (data.new_capped ? "More than " : "") + data.new + " new job" + (data.new === 1 && !data.new_capped ? "" : "s") + " match: show them";
        link.href = "?" + params.toString();
        if (link.textContent !== text) { changes.push(text.replace(": show them", "")); }
        link.textContent = text;
        link.hidden = false;
      } else {
        link.hidden = true;
      }
    }
    return changes.length ? "Changed: " + changes.slice(0, 3).join("; ") + (changes.length > 3 ? "; and " + (changes.length - 3) + " more." : ".") : "";
  }

  // --- polling --------------------------------------------------------------------------------

  function start(bar) {
    var kind = bar.getAttribute("data-fq-live");
    var base = bar.getAttribute("data-url");
    var interval = parseInt(bar.getAttribute("data-interval"), 10) || 5000;
    var toggle = document.getElementById("fq-live-toggle");
    var stateEl = document.getElementById("fq-live-state");
    var timeEl = document.getElementById("fq-live-time");
    var statusEl = document.getElementById("fq-live-status");
    var paused = storedPaused();
    var delay = interval;
    var timer = null;
    var inFlight = false;
    var stopped = false;

    function describe(extra) {
      if (stopped) { return; }
      if (paused) { stateEl.textContent = "Live updates paused."; }
      else if (document.hidden) { stateEl.textContent = "Live: once a minute while this tab is hidden."; }
      else if (delay > interval) { stateEl.textContent = "Live: the last update failed" + (extra ? " (" + extra + ")" : "") + "; next try in " + Math.round(delay / 1000) + " s."; }
      else { stateEl.textContent = "Live: updates every " + Math.round(interval / 1000) + " s."; }
    }

    function schedule(ms) {
      window.clearTimeout(timer);
      if (paused || stopped) { return; }
      timer = window.setTimeout(poll, ms);
    }

    function stop(reason) {
      stopped = true;
      window.clearTimeout(timer);
      stateEl.textContent = "Live updates stopped: " + reason;
      toggle.disabled = true;
    }

    function poll() {
      if (paused || stopped || inFlight) { return; }
      var url = base + (base.indexOf("?") < 0 ? "?" : "&") + (kind === "jobs" ? jobsQuery(bar) : "");
      inFlight = true;
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" }, cache: "no-store" })
        .then(function (response) {
          var type = response.headers.get("Content-Type") || "";
          if (response.redirected || type.indexOf("application/json") < 0) {
            // The admin sent its login page: the session ended.
            throw { fatal: "log in again, then reload the page." };
          }
          if (response.status === 403) { throw { fatal: "you may no longer view this page." }; }
          return response.json().then(function (data) {
            if (response.status === 400) { throw { fatal: (data.errors || ["the filters are not valid"]).join("; ") }; }
            if (!response.ok) { throw { soft: "the server answered " + response.status }; }
            return data;
          });
        })
        .then(function (data) {
          inFlight = false;
          var said = kind === "jobs" ? updateJobs(data) : updateDashboard(data);
          timeEl.textContent = data.now_text;
          timeEl.setAttribute("datetime", new Date(data.now).toISOString());
          if (said) { statusEl.textContent = said; }
          delay = interval;
          describe();
          schedule(document.hidden ? HIDDEN_MS : delay);
        })
        .catch(function (err) {
          inFlight = false;
          if (err && err.fatal) { stop(err.fatal); return; }
          delay = Math.min(delay * 2, MAX_BACKOFF_MS);
          describe(err && err.soft ? err.soft : "no answer");
          schedule(document.hidden ? Math.max(delay, HIDDEN_MS) : delay);
        });
    }

    function render() {
      toggle.textContent = paused ? "Resume live updates" : "Pause live updates";
      bar.classList.toggle("fq-live-paused", paused);
      describe();
    }

    toggle.addEventListener("click", function () {
      paused = !paused;
      storePaused(paused);
      render();
      if (paused) { window.clearTimeout(timer); } else { delay = interval; poll(); }
    });
    document.addEventListener("visibilitychange", function () {
      describe();
      if (!document.hidden && !paused && !stopped) { delay = interval; poll(); }
    });
    document.querySelectorAll(".fq-live-nojs").forEach(function (el) { el.hidden = true; });
    bar.hidden = false;
    render();
    if (!paused) { schedule(interval); }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var bar = document.getElementById("fq-live");
    if (bar && window.fetch && window.URLSearchParams) { start(bar); }
  });
})();
