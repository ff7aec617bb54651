/* The admin console: live plots (uPlot), the usage plot, trace waterfalls.
   Runs under the strict CSP: no inline code; styles are set through the CSSOM only. */
(function () {
  "use strict";

  const COLORS = ["#4f46e5", "#dc2626", "#059669", "#d97706", "#0891b2", "#7c3aed", "#db2777"];
  const plots = new Map(); // figure -> {plot, names}

  function seriesFor(key, all) {
    return Object.keys(all).filter((n) => {
      const base = n.split("|")[0];
      return base === key || base.startsWith(key + "_");
    }).sort();
  }

  function label(name, key) {
    const [base, raw] = name.split("|");
    const who = (raw || "").replace(/^https?:\/\//, ""); // a replica's URL: host:port is enough
    if (base === key) return who || base;
    // "ttft_p50_s" in the "ttft" plot is "p50"; "replica_load_queued" in "replica_load", "queued"
    const tag = base.slice(key.length + 1).replace(/_s$/, "");
    return who ? who + " " + tag : base;
  }

  function draw(figure, t, all) {
    const area = figure.querySelector(".plot-area");
    const empty = figure.querySelector(".plot-empty");
    const names = seriesFor(figure.dataset.plot, all);
    figure.dataset.points = String(t.length);
    figure.dataset.series = names.join(",");
    if (!names.length || !t.length) {
      if (empty) empty.hidden = false;
      return;
    }
    if (empty) empty.hidden = true;
    const data = [t, ...names.map((n) => all[n])];
    const held = plots.get(figure);
    const width = Math.max(260, area.clientWidth || 420);
    if (held && held.names.join() === names.join()) {
      held.plot.setData(data);
    } else {
      if (held) held.plot.destroy();
      const unit = figure.dataset.unit || "";
      const opts = {
        width: width,
        height: 180,
        series: [{}, ...names.map((n, i) => ({
          label: label(n, figure.dataset.plot), stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: false,
          value: (u, v) => (v == null ? "–" : (+v.toPrecision(3)) + (unit ? " " + unit : "")),
        }))],
        axes: [{}, {size: 56}],
        scales: {x: {time: true}},
      };
      plots.set(figure, {plot: new window.uPlot(opts, data, area), names: names});
    }
    figure.dataset.rendered = "true";
    figure.dataset.updates = String(Number(figure.dataset.updates || "0") + 1);
  }

  async function poll(root) {
    if (!document.body.contains(root)) return;
    let interval = 5;
    try {
      const res = await fetch(root.dataset.src, {headers: {Accept: "application/json"}});
      if (res.ok) {
        const body = await res.json();
        interval = body.interval_s || interval;
        // every plot of the page (the per-model ones and, in router mode, the per-replica ones)
        document.querySelectorAll(".console-plots figure[data-plot]").forEach(
          (f) => draw(f, body.t, body.series));
      }
    } catch (e) { /* the server restarted: try again next tick */ }
    window.setTimeout(() => poll(root), Math.max(1000, interval * 1000));
  }

  async function usagePlot(figure) {
    const res = await fetch(figure.dataset.src, {headers: {Accept: "application/json"}});
    if (!res.ok) return;
    const u = await res.json();
    const t = u.days.map((d) => Date.parse(d + "T12:00:00Z") / 1000);
    const area = figure.querySelector(".plot-area");
    area.textContent = "";
    const opts = {
      width: Math.max(300, area.clientWidth || 600), height: 200,
      series: [{}, {label: "tokens", stroke: COLORS[0], fill: "rgba(79,70,229,.12)"},
               {label: "requests", stroke: COLORS[2], scale: "req"}],
      axes: [{}, {size: 60}, {scale: "req", side: 1, grid: {show: false}}],
      scales: {x: {time: true}},
    };
    new window.uPlot(opts, [t, u.tokens, u.requests], area);
    figure.dataset.rendered = "true";
  }

  function waterfall(list) {
    const total = parseFloat(list.dataset.total) || 1;
    list.querySelectorAll(".waterfall-row").forEach((row) => {
      const bar = row.querySelector(".waterfall-bar");
      const start = parseFloat(row.dataset.start) || 0;
      const dur = parseFloat(row.dataset.duration) || 0;
      bar.style.left = (100 * start / total) + "%";
      bar.style.width = Math.max(0.3, 100 * dur / total) + "%";
      row.querySelector(".waterfall-name").style.paddingLeft = (row.dataset.depth || 0) * 14 + "px";
    });
  }

  function init(root) {
    const live = root.querySelector("#live-plots");
    if (live && !live.dataset.polling) { live.dataset.polling = "1"; poll(live); }
    const usage = root.querySelector("#usage-plot");
    if (usage) usagePlot(usage);
    root.querySelectorAll(".waterfall").forEach(waterfall);
  }

  document.addEventListener("DOMContentLoaded", () => init(document));
  document.addEventListener("htmx:afterSettle", () => init(document));
})();
