// Typeset the maths of a page with KaTeX, served by the site itself (docs/assets/vendor/katex/, see `make docs`).
// pymdownx.arithmatex (generic mode) leaves inline maths as <span class="arithmatex">\(...\)</span> and display
// maths as <div class="arithmatex">\[...\]</div>. A formula KaTeX cannot typeset, or typesets only leniently, is
// reported on the console as an error (`make docs-check` fails on console errors) and left as its source.
(function () {
  "use strict";

  function source(element) {
    var tex = element.textContent.trim();
    var display = element.tagName === "DIV";
    var delimiters = [["\\(", "\\)", false], ["\\[", "\\]", true], ["$$", "$$", true], ["$", "$", false]];
    for (var i = 0; i < delimiters.length; i++) {
      var open = delimiters[i][0], close = delimiters[i][1];
      if (tex.length >= open.length + close.length && tex.startsWith(open) && tex.endsWith(close)) {
        return { tex: tex.slice(open.length, tex.length - close.length), display: delimiters[i][2] || display };
      }
    }
    return { tex: tex, display: display };
  }

  function typeset(root) {
    if (typeof katex === "undefined") {
      console.error("KaTeX is not loaded: the maths of this page is shown as source");
      return;
    }
    root.querySelectorAll(".arithmatex").forEach(function (element) {
      if (element.querySelector(".katex")) {
        return; // already typeset (instant navigation may hand the same element over again)
      }
      var math = source(element);
      try {
        katex.render(math.tex, element, {
          displayMode: math.display,
          throwOnError: true,
          strict: function (code, message) {
            console.error("KaTeX (" + code + "): " + message + " in " + JSON.stringify(math.tex));
            return "ignore";
          },
        });
      } catch (error) {
        console.error("KaTeX cannot typeset " + JSON.stringify(math.tex) + ": " + error.message);
      }
    });
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { typeset(document); }); // Material: on every page load
  } else {
    document.addEventListener("DOMContentLoaded", function () { typeset(document); });
  }
})();
