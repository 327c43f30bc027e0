// The bulk action's progress page posts its next batch by itself until it is paused
// (django_fq/admin/bulk.py). Without JavaScript the Continue button does the same.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var form = document.querySelector("form[data-fq-continue]");
    if (!form) { return; }
    var pause = document.getElementById("fq-bulk-pause");
    var paused = window.sessionStorage && sessionStorage.getItem("fq-bulk-paused") === "1";
    pause.hidden = false;
    pause.textContent = paused ? "Resume" : "Pause";
    pause.addEventListener("click", function () {
      paused = !paused;
      if (window.sessionStorage) { sessionStorage.setItem("fq-bulk-paused", paused ? "1" : "0"); }
      pause.textContent = paused ? "Resume" : "Pause";
      if (!paused) { form.submit(); }
    });
    if (!paused) { window.setTimeout(function () { if (!paused) { form.submit(); } }, 150); }
  });
})();
