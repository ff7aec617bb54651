// The reader's light or dark choice, applied before the first paint: loaded without defer
// in <head>, so a dark page never flashes white ("system" leaves the OS preference).
(function () {
  "use strict";
  try {
    const theme = localStorage.getItem("chatbox-theme");
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  } catch (err) { /* storage refused: the OS preference applies */ }
})();
