// chatbox UI glue: Enter to send, Esc to stop, auto-grow, scroll-follow, copy, friendly errors.
(function () {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);

  function scroller() { return $("#scroll"); }
  let stick = true; // follow the newest text while the reader is at the bottom
  function nearBottom() {
    const s = scroller();
    return !s || s.scrollHeight - s.scrollTop - s.clientHeight < 80;
  }
  function toBottom() { const s = scroller(); if (s) s.scrollTop = s.scrollHeight; }

  function grow(t) {
    t.style.height = "auto";
    t.style.height = Math.min(t.scrollHeight, window.innerHeight * 0.4) + "px";
  }

  function streaming() { return $(".turn.streaming"); }

  function stop() {
    const b = $(".composer .stop");
    if (b && streaming()) b.click();
  }

  function showAlert(message) {
    const box = $("#alerts");
    if (!box) return;
    box.innerHTML = "";
    const div = document.createElement("div");
    div.className = "alert";
    div.setAttribute("role", "alert");
    const span = document.createElement("span");
    span.textContent = message;
    const close = document.createElement("button");
    close.type = "button";
    close.className = "icon-btn sm";
    close.dataset.action = "dismiss";
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "×";
    div.append(span, close);
    box.append(div);
  }

  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (e.key === "Escape") {
      if (streaming()) { e.preventDefault(); stop(); return; }
      document.body.classList.remove("nav-open");
      const d = $("details.settings[open]");
      if (d) { d.open = false; d.querySelector("summary")?.focus(); }
      return;
    }
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && t instanceof HTMLTextAreaElement &&
        (t.id === "composer-input" || t.closest(".edit-form"))) {
      e.preventDefault();
      if (!t.value.trim()) return;
      t.form.requestSubmit();
    }
  });

  document.addEventListener("input", (e) => {
    if (e.target instanceof HTMLTextAreaElement && e.target.id === "composer-input") grow(e.target);
  });

  document.addEventListener("click", (e) => {
    const el = e.target.closest("[data-action]");
    if (!el) return;
    const action = el.dataset.action;
    if (action === "open-nav") document.body.classList.add("nav-open");
    else if (action === "close-nav") document.body.classList.remove("nav-open");
    else if (action === "dismiss") el.closest(".alert, .conv-dialog, .support-alert")?.remove();
    else if (action === "attach") $("#attach-input")?.click();
    else if (action === "copy") {
      const body = el.closest(".turn")?.querySelector(".md, .plain");
      if (body) copy(el, plainText(body));
    } else if (action === "copy-code") {
      const code = el.closest("pre")?.querySelector("code");
      if (code) copy(el, code.innerText);
    } else if (action === "copy-input") {
      const input = el.closest("form, section, label, div")?.querySelector("input");
      if (input) copy(el, input.value);
    } else if (action === "starter") {
      const t = $("#composer-input");
      if (t && t.form) { t.value = el.dataset.prompt || el.textContent.trim(); t.form.requestSubmit(); }
    } else if (action === "rename") {
      const form = el.closest(".conv-row")?.querySelector(".conv-rename");
      if (form) { form.hidden = false; const i = form.querySelector("input"); i.focus(); i.select(); }
    } else if (action === "cancel-rename") {
      const form = el.closest(".conv-rename");
      if (form) form.hidden = true;
    }
  });

  // Copy to the clipboard; the button says so for a moment.
  function copy(el, text) {
    if (!navigator.clipboard) return;
    navigator.clipboard.writeText(text).then(() => {
      el.classList.add("done");
      const label = el.querySelector(".copy-label");
      const named = el.getAttribute("aria-label"); // its name keeps containing what it shows
      if (label) label.textContent = "Copied";
      if (label && named) el.setAttribute("aria-label", "Copied");
      setTimeout(() => {
        el.classList.remove("done");
        if (label) label.textContent = "Copy";
        if (label && named) el.setAttribute("aria-label", named);
      }, 1200);
    });
  }

  // The text a reader sees, without the code blocks' Copy buttons, math as its TeX source.
  function plainText(body) {
    if (!body.querySelector(".copy-code, [data-tex]")) return body.innerText;
    const clone = body.cloneNode(true);
    clone.querySelectorAll(".copy-code").forEach((b) => b.remove());
    clone.querySelectorAll("[data-tex]").forEach((m) => {
      const d = m.classList.contains("math-display") ? "$$" : "$";
      m.textContent = d + m.dataset.tex + d;
    });
    clone.classList.add("offscreen");
    document.body.append(clone);
    const text = clone.innerText;
    clone.remove();
    return text;
  }

  // Light, dark or the system's: kept in localStorage; theme.js applies it before the first paint.
  function setTheme(choice) {
    try { localStorage.setItem("chatbox-theme", choice); } catch (err) { /* private mode */ }
    if (choice === "light" || choice === "dark") document.documentElement.dataset.theme = choice;
    else delete document.documentElement.dataset.theme;
    document.querySelectorAll("[data-action=theme]").forEach((b) => {
      if (b instanceof HTMLSelectElement) b.value = choice;
    });
  }
  document.addEventListener("change", (e) => {
    const el = e.target;
    if (el instanceof HTMLSelectElement && el.dataset.action === "theme") setTheme(el.value);
    if (el instanceof HTMLInputElement && el.dataset.toolsFor) keepTools(el);
  });

  // The composer's tool switch is per chat: its state is kept in localStorage by chat id
  // (a chat started with it on is rendered on, and kept from then).
  function toolsKey(el) { return "chatbox-tools:" + el.dataset.toolsFor; }
  function keepTools(el) {
    try { localStorage.setItem(toolsKey(el), el.checked ? "on" : "off"); } catch (err) { /* private mode */ }
  }
  function restoreTools(root) {
    root.querySelectorAll("input[data-tools-for]").forEach((el) => {
      if (!el.dataset.toolsFor) return; // the new-chat page: off until switched on
      let kept = null;
      try { kept = localStorage.getItem(toolsKey(el)); } catch (err) { /* private mode */ }
      if (kept === null) keepTools(el);
      else el.checked = kept === "on";
    });
  }
  document.addEventListener("DOMContentLoaded", () => restoreTools(document));
  document.addEventListener("htmx:afterSettle", () => restoreTools(document));

  // Rendered answers get a Copy button on each code block, and their math typeset (KaTeX).
  function decorate(root) {
    if (!root || !root.querySelectorAll) return;
    root.querySelectorAll(".md pre").forEach((pre) => {
      if (pre.querySelector(".copy-code")) return;
      const b = document.createElement("button");
      b.type = "button";
      b.className = "copy-code";
      b.dataset.action = "copy-code";
      b.setAttribute("aria-label", "Copy code");
      const label = document.createElement("span");
      label.className = "copy-label";
      label.textContent = "Copy";
      b.append(label);
      pre.append(b);
    });
    if (window.katex) {
      root.querySelectorAll(".md .math-inline:not([data-typeset]), .md .math-display:not([data-typeset])").forEach((el) => {
        const tex = el.textContent;
        el.dataset.typeset = "1";
        el.dataset.tex = tex;
        // U+FFFD marks bytes that were not text: no formula to typeset (KaTeX would warn).
        if (tex.includes("\uFFFD")) { el.classList.add("math-error"); return; }
        try {
          // Errors are thrown and shown as the TeX itself: KaTeX's error node sets an inline style the CSP refuses.
          window.katex.render(tex, el, { displayMode: el.classList.contains("math-display"), throwOnError: true, strict: "ignore" });
        } catch (err) { el.textContent = tex; el.classList.add("math-error"); }
      });
    }
  }
  document.addEventListener("htmx:load", (e) => decorate(e.target));
  document.addEventListener("htmx:sseMessage", (e) => decorate(e.target));

  // A send shows the user's bubble at once; while it waits (a model loading, a queue) the
  // answer's place says why, so a slow first message is never a silent wait.
  let pending = null;
  function bubble(cls, build) {
    const a = document.createElement("article");
    a.className = "turn pending " + cls;
    build(a);
    return a;
  }
  async function explainWait(form, note) {
    if (!pending || !note.isConnected || !form.dataset.loadingUrl) return;
    const asked = pending;
    try {
      const r = await fetch(form.dataset.loadingUrl, { headers: { accept: "application/json" } });
      const loading = r.ok ? (await r.json()).loading : {};
      const names = Object.keys(loading);
      if (names.length) {
        const waiting = Math.max(...names.map((n) => loading[n]));
        note.textContent = "Loading the model " + names.join(", ") + "… " +
          (waiting > 1 ? waiting + " messages are waiting for it." : "Your message will be answered once it is ready.");
      }
    } catch (err) { /* the note keeps saying it is sending */ }
    if (pending === asked) pending.timer = setTimeout(() => explainWait(form, note), 1000);
  }
  document.addEventListener("htmx:beforeRequest", (e) => {
    const form = e.detail.elt;
    if (!form || form.id !== "composer") return;
    const text = (form.querySelector("#composer-input")?.value || "").trim();
    const turns = $("#turns");
    if (!text || !turns) return;
    const mine = bubble("user", (a) => {
      const b = document.createElement("div");
      b.className = "bubble";
      const p = document.createElement("div");
      p.className = "plain";
      p.textContent = text;
      b.append(p);
      a.append(b);
    });
    const note = document.createElement("p");
    note.className = "muted wait-note";
    note.textContent = "Sending…";
    const answer = bubble("assistant", (a) => { a.setAttribute("role", "status"); a.append(note); });
    turns.append(mine, answer);
    toBottom();
    pending = { nodes: [mine, answer], timer: setTimeout(() => explainWait(form, note), 400) };
  });
  function clearPending() {
    if (!pending) return;
    clearTimeout(pending.timer);
    pending.nodes.forEach((n) => n.remove());
    pending = null;
  }
  // Swaps name their target; the form that asked may be swapped out (a temporary chat's
  // first send replaces its composer) before its afterRequest could reach the document.
  document.addEventListener("htmx:beforeSwap", (e) => {
    if ((e.detail.requestConfig?.elt || e.detail.elt)?.id === "composer") clearPending();
  });

  // The message box empties once a send is accepted; an error keeps the text.
  document.addEventListener("htmx:afterRequest", (e) => {
    const form = e.detail.elt;
    if (form && form.id === "composer") clearPending();
    if (form && form.id === "attach-form") {
      form.reset(); // the same file can be picked again
      if (e.detail.successful) $("#alerts") && ($("#alerts").innerHTML = "");
    }
    if (form && form.id === "library-upload") {
      form.reset();
      if (e.detail.successful) $("#alerts") && ($("#alerts").innerHTML = "");
    }
    if (form && form.classList.contains("memory-add") && e.detail.successful) form.reset();
    // A page opened on another branch (?turn=) sends there once; then that branch is active.
    if (e.detail.successful && /\/(send|branch|edit|regenerate)$/.test(e.detail.pathInfo?.requestPath || "")) {
      document.querySelector('#composer input[name="parent_id"]')?.remove();
    }
    // A message answered with support (retargeted to #alerts) was not sent: it stays, as after an error.
    const sent = e.detail.successful && e.detail.xhr?.getResponseHeader("HX-Retarget") !== "#alerts";
    if (form && form.id === "composer" && sent) {
      form.reset();
      const t = $("#composer-input");
      if (t) { t.value = t.defaultValue = ""; grow(t); t.focus(); } // a kept draft is sent now
      $("#alerts") && ($("#alerts").innerHTML = "");
    }
  });
  // One header panel open at a time (share, settings): opening one closes the other.
  document.addEventListener("toggle", (e) => {
    const opened = e.target;
    if (!(opened instanceof HTMLDetailsElement) || !opened.open || !opened.matches(".head-tools > details")) return;
    document.querySelectorAll(".head-tools > details[open]").forEach((d) => { if (d !== opened) d.open = false; });
  }, true);
  // A dialog (delete: what of the share links?) takes the focus; a new share link is
  // selected, ready to copy.
  document.addEventListener("htmx:afterSwap", (e) => {
    const path = e.detail.pathInfo?.requestPath || "";
    if (path.endsWith("/shares")) {
      const url = document.querySelector(".share-url");
      if (url) { url.focus(); url.select(); }
    } else if (/\/delete(\?|$)/.test(path)) {
      document.querySelector(".conv-dialog button")?.focus();
    }
  });
  // What a form says (an error, an import's result) is scrolled to when it lands out of
  // sight, as it does for a form low on a phone's page.
  document.addEventListener("htmx:afterSwap", (e) => {
    const t = e.detail.target;
    if (!t || !["alerts", "import-status"].includes(t.id) || !t.firstElementChild) return;
    const r = t.getBoundingClientRect();
    if (r.top < 0 || r.bottom > window.innerHeight) t.scrollIntoView({ block: "nearest" });
  });
  // A comment box that opens under an answer's thumbs is brought into sight above the
  // composer (on a phone the newest answer's thumbs sit right on it) and takes the focus.
  document.addEventListener("htmx:afterSettle", (e) => {
    const id = e.detail.target && e.detail.target.id;
    if (!id || !id.startsWith("feedback-")) return;
    const form = document.getElementById(id)?.querySelector(".feedback-comment");
    const s = scroller();
    if (!form || !s) return;
    const r = form.getBoundingClientRect(), view = s.getBoundingClientRect();
    const composer = $("#composer");
    const bottom = Math.min(view.bottom, composer ? composer.getBoundingClientRect().top : view.bottom);
    if (r.bottom > bottom) s.scrollTop += r.bottom - bottom + 8;
    else if (r.top < view.top) s.scrollTop -= view.top - r.top + 8;
    form.querySelector("input[name=comment]")?.focus({ preventScroll: true });
  });
  document.addEventListener("htmx:beforeRequest", () => { stick = true; });
  // The sidebar's search runs as you type; Enter does not submit its form.
  document.addEventListener("submit", (e) => {
    if (e.target instanceof HTMLFormElement && e.target.matches(".sidebar-search")) e.preventDefault();
  });

  // Error responses that are not our HTML (e.g. a proxy's page or JSON) become a plain alert.
  document.addEventListener("htmx:beforeSwap", (e) => {
    const xhr = e.detail.xhr;
    if (!xhr || xhr.status < 400) return;
    const type = xhr.getResponseHeader("Content-Type") || "";
    if (!xhr.getResponseHeader("HX-Retarget") || !type.startsWith("text/html")) {
      e.detail.shouldSwap = false;
      let msg = "Something went wrong (" + xhr.status + "). Please try again.";
      try { msg = JSON.parse(xhr.responseText).error.message || msg; } catch (_) { /* not JSON */ }
      if (xhr.status === 503) {
        const wait = xhr.getResponseHeader("Retry-After");
        msg = "The server is busy right now." + (wait ? " Please try again in " + wait + " s." : "");
      }
      showAlert(msg);
    }
  });
  document.addEventListener("htmx:sendError", () => {
    showAlert("Can't reach the server. Check that chatbox is running, then try again.");
  });

  document.addEventListener("htmx:sseBeforeMessage", () => { stick = nearBottom(); });
  document.addEventListener("htmx:sseMessage", () => { if (stick) toBottom(); });
  document.addEventListener("htmx:afterSettle", (e) => {
    const t = e.detail.target;
    if (t && (t.id === "turns" || t.id === "main")) toBottom();
    const edit = t && t.querySelector && t.querySelector(".edit-form textarea");
    if (edit) { edit.focus(); edit.setSelectionRange(edit.value.length, edit.value.length); }
    const title = $(".chat-title"), active = $(".conv-item.active .conv-title");
    if (title && active && title.textContent === "New chat" && active.textContent !== "New chat") {
      title.textContent = active.textContent; // the first message named the chat
      document.title = active.textContent + " · chatbox";
    }
    if (t && t.id === "main") document.title = ($(".chat-title")?.textContent || "chatbox") + " · chatbox";
  });

  // A search hit opens /c/…?turn=ID&q=words#turn-ID: show that turn, its words marked.
  function markWords(root, query) {
    const words = (query.match(/[\p{L}\p{N}_]{3,}/gu) || []).map((w) => w.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    if (!words.length) return;
    const re = new RegExp("(" + words.join("|") + ")[\\p{L}\\p{N}_]*", "giu");
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) nodes.push(walker.currentNode);
    for (const node of nodes) {
      const text = node.nodeValue;
      re.lastIndex = 0;
      if (!re.test(text)) continue;
      re.lastIndex = 0;
      const frag = document.createDocumentFragment();
      let last = 0;
      for (const m of text.matchAll(re)) {
        frag.append(text.slice(last, m.index));
        const mark = document.createElement("mark");
        mark.textContent = m[0];
        frag.append(mark);
        last = m.index + m[0].length;
      }
      frag.append(text.slice(last));
      node.replaceWith(frag);
    }
  }
  function showHit() {
    const id = decodeURIComponent(location.hash.slice(1));
    const turn = id.startsWith("turn-") ? document.getElementById(id) : null;
    if (!turn) return false;
    const q = new URLSearchParams(location.search).get("q");
    const body = turn.querySelector(".md, .plain");
    if (q && body && !body.querySelector("mark")) markWords(body, q);
    document.querySelectorAll(".turn.hit").forEach((t) => t.classList.remove("hit"));
    turn.classList.add("hit");
    // The matched words, not the turn's middle: a long answer centred can hide them.
    (turn.querySelector("mark") || turn).scrollIntoView({ block: "center" });
    return true;
  }
  window.addEventListener("hashchange", showHit);
  window.addEventListener("load", () => requestAnimationFrame(showHit)); // after the jump to #

  document.addEventListener("DOMContentLoaded", () => {
    decorate(document.body);
    let theme = "system";
    try { theme = localStorage.getItem("chatbox-theme") || "system"; } catch (err) { /* private mode */ }
    document.querySelectorAll("select[data-action=theme]").forEach((s) => { s.value = theme; });
    if (!showHit()) toBottom();
    const t = $("#composer-input");
    if (t) grow(t);
  });
  // Times arrive in UTC (<time datetime>); each reader sees them in their own locale and zone.
  const stamp = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });
  function localTimes(root) {
    root.querySelectorAll("time.local-time[datetime]:not([data-local])").forEach((el) => {
      const at = new Date(el.getAttribute("datetime"));
      if (isNaN(at)) return;
      el.title = el.textContent;
      el.textContent = stamp.format(at);
      el.dataset.local = "1";
    });
  }
  document.addEventListener("DOMContentLoaded", () => localTimes(document));
  document.addEventListener("htmx:afterSettle", () => localTimes(document));
  // The tab says the chat's title, also after a rename swaps the header in place.
  document.addEventListener("htmx:afterSettle", () => {
    const h = $("#chat-head .chat-title");
    if (h) document.title = h.textContent.trim() + " · chatbox";
  });
})();
