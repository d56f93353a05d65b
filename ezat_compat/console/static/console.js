// The console's only script (served from the console's own origin: its Content-Security-Policy
// allows no inline script). Two behaviours, both declared in the markup:
//   <button type="button" data-copy="#element-id">Copy</button>  copies the target's text;
//   <form data-confirm="Revoke this key?">                       asks before it is submitted.
"use strict";

(function () {
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    // Plain HTTP (a loopback console): the older way, through a selected, off-screen textarea.
    return new Promise(function (resolve, reject) {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "copy-buffer";
      document.body.appendChild(area);
      area.select();
      try {
        if (document.execCommand("copy")) {
          resolve();
        } else {
          reject(new Error("copy refused"));
        }
      } catch (err) {
        reject(err);
      } finally {
        document.body.removeChild(area);
      }
    });
  }

  function onCopy(button) {
    var target = document.querySelector(button.getAttribute("data-copy"));
    if (!target) {
      return;
    }
    var label = button.textContent;
    copyText(target.textContent.trim()).then(
      function () {
        button.textContent = "Copied";
        window.setTimeout(function () { button.textContent = label; }, 2000);
      },
      function () {
        var range = document.createRange();  // at least select it for Ctrl+C
        range.selectNodeContents(target);
        var selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
      }
    );
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-copy]") : null;
    if (button) {
      event.preventDefault();
      onCopy(button);
    }
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });
})();
