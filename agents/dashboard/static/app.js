// stream-dp live dashboard: server-sent events -> SVG charts. No dependencies, no CDN.
"use strict";

(function () {
  const MAX_POINTS = 600;
  const MAX_CHARTS = 8;
  const MAX_LIST = 500;       // stream names listed at once; the prefix filter narrows the rest
  const SVG_NS = "http://www.w3.org/2000/svg";

  const state = {
    series: new Map(),      // stream -> {meta, points: [[tick, tickEnd, value, stderr], ...]}
    selected: [],           // charted streams, in selection order
    userSelected: false,    // once the user picks, do not auto-select
    histogram: null,
    marginals: null,        // latest dp.marginals.v1 (binary-attribute domains)
    prefix: "",
    source: null,
    messages: 0,
    lastTick: null,
    budgetUnits: [["stream", 1]],  // [unit, multiplier of a record's budget] (snapshot)
    meta: {},               // strategy, p, privacy, … of the newest streams (live rows carry none)
  };

  const $ = (id) => document.getElementById(id);
  const fmt = (x) => {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    const a = Math.abs(x);
    if (a >= 1e5) return x.toExponential(2);
    if (a >= 100) return x.toFixed(1);
    if (a >= 1) return x.toFixed(2);
    return x.toFixed(3);
  };
  const el = (tag, attrs, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const svgEl = (tag, attrs) => {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  };

  // ------------------------------------------------------------------ data
  function addPoint(name, row, meta) {
    let s = state.series.get(name);
    if (!s) {
      s = { meta: meta || state.meta, points: [] };
      state.series.set(name, s);
      listDirty = true;
    }
    const pts = s.points;
    const tick = row[0];
    if (pts.length && tick <= pts[pts.length - 1][0]) {
      const i = pts.findIndex((p) => p[0] >= tick);
      if (i >= 0 && pts[i][0] === tick) pts[i] = row; else pts.splice(i < 0 ? pts.length : i, 0, row);
    } else {
      pts.push(row);
    }
    if (pts.length > MAX_POINTS) pts.splice(0, pts.length - MAX_POINTS);
    if (state.lastTick === null || tick > state.lastTick) state.lastTick = tick;
  }

  function autoSelect() {
    if (state.userSelected) return;
    // only series still being released: a binary-attribute deployment re-decides its tables
    // every epoch, and the cells of an earlier epoch's tables stop at that epoch's last tick
    const fresh = [...state.series.entries()].filter(([, s]) => {
      const pts = s.points;
      return pts.length && state.lastTick !== null && pts[pts.length - 1][0] >= state.lastTick - 1;
    }).map(([name]) => name);
    const names = fresh.sort((a, b) => a.length - b.length || (a < b ? -1 : 1));
    const want = names.slice(0, 4);
    if (want.join("\n") !== state.selected.join("\n")) {
      state.selected = want;
      listDirty = true;
    }
  }

  // ------------------------------------------------------------------ rendering (batched)
  let listDirty = true, chartsDirty = true, histDirty = true, frame = 0;
  function schedule() {
    if (!frame) frame = requestAnimationFrame(render);
  }
  function render() {
    frame = 0;
    autoSelect();
    if (listDirty) renderList();
    if (chartsDirty) renderCharts();
    if (histDirty) renderHistogram();
    listDirty = chartsDirty = histDirty = false;
    renderStatus();
  }

  function renderStatus(text, kind) {
    const st = $("status");
    if (text) {
      st.textContent = text;
      st.dataset.state = kind;
      return;
    }
    if (st.dataset.state === "live") {
      st.textContent = `live · last tick ${state.lastTick ?? "–"} · ${state.messages} messages`;
    }
  }

  function renderList() {
    const ul = $("stream-list");
    ul.textContent = "";
    const all = [...state.series.keys()].sort();
    const names = all.slice(0, MAX_LIST);
    for (const name of state.selected) if (!names.includes(name) && state.series.has(name)) names.unshift(name);
    for (const name of names) {
      const li = el("li");
      const label = el("label", { title: name });
      const box = el("input", { type: "checkbox", "data-stream": name });
      box.checked = state.selected.includes(name);
      box.addEventListener("change", () => {
        state.userSelected = true;
        if (box.checked) {
          state.selected.push(name);
          if (state.selected.length > MAX_CHARTS) state.selected.shift();
        } else {
          state.selected = state.selected.filter((n) => n !== name);
        }
        listDirty = chartsDirty = true;
        schedule();
      });
      label.append(box, document.createTextNode(" " + name));
      li.append(label);
      ul.append(li);
    }
    if (all.length > MAX_LIST) {
      ul.append(el("li", { class: "hint" }, `… ${all.length - MAX_LIST} more: type a prefix above`));
    }
  }

  function renderCharts() {
    const box = $("charts");
    const keep = new Set(state.selected);
    for (const c of [...box.children]) if (!keep.has(c.dataset.stream)) c.remove();
    for (const name of state.selected) {
      let card = box.querySelector(`.chart[data-stream="${CSS.escape(name)}"]`);
      if (!card) {
        card = el("div", { class: "chart", "data-stream": name });
        const title = el("div", { class: "title" });
        title.append(el("b", { title: name }, name), el("span", { class: "latest" }));
        card.append(title, svgEl("svg", { viewBox: "0 0 400 170", preserveAspectRatio: "none" }));
        box.append(card);
      }
      drawChart(card, state.series.get(name));
    }
    $("no-data").style.display = state.series.size ? "none" : "";
  }

  // a record's privacy is its stream's budget; one event feeds several streams, so the
  // guarantee per event is that times the multiplier the server sends (budget_units)
  // a budget shown with 6 significant digits, rounded up (a figure shown is an upper bound:
  // to the nearest, 0.3703701 would show as 0.37037), a float's own noise (below 1e-12 of it)
  // shown as the decimal it stands for (stream_dp.user_level.rounding.format_up)
  function upTo6(x) {
    const near = Number(x.toPrecision(6));
    if (!(x - near > 1e-12 * Math.abs(x))) return near;
    const step = Math.pow(10, Math.floor(Math.log10(Math.abs(x))) - 5);
    return Number((Math.ceil(x / step) * step).toPrecision(6));
  }

  function budgetLabel(privacy) {
    if (!privacy) return "";
    const pure = privacy.model === "pure";
    const v = Number(pure ? privacy.epsilon : privacy.rho);
    if (!isFinite(v)) return "";
    const sym = pure ? "ε" : "ρ";
    const labels = state.budgetUnits
      .map(([unit, k]) => `${sym}=${upTo6(k * v)} per ${unit}`);
    // a user-level record says what its budget means for one person per period (per stream
    // and over every stream a person reaches): privacy.unit = "person"
    const person = privacy.unit === "person" ? privacy.per_person : null;
    if (person && isFinite(Number(person.stream)) && isFinite(Number(person.total))) {
      labels.push(`${sym}=${upTo6(Number(person.total))} per person per period`
        + ` (${sym}=${upTo6(Number(person.stream))} per stream)`);
    }
    return labels.join(" · ");
  }

  function drawChart(card, s) {
    const svg = card.querySelector("svg");
    svg.textContent = "";
    const pts = s ? s.points : [];
    card.dataset.points = String(pts.length);
    card.dataset.lastTick = pts.length ? String(pts[pts.length - 1][0]) : "";
    const latest = card.querySelector(".latest");
    if (!pts.length) { latest.textContent = "no releases yet"; return; }
    const last = pts[pts.length - 1];
    const meta = s.meta || {};
    const priv = budgetLabel(meta.privacy);
    latest.textContent = `tick ${last[0]}: ${fmt(last[2])} ± ${fmt(last[3])}  ${meta.strategy || ""} ${priv}`;

    const W = 400, H = 170, L = 44, R = 6, T = 8, B = 18;
    const t0 = pts[0][0], t1 = Math.max(pts[pts.length - 1][0], t0 + 1);
    let lo = Infinity, hi = -Infinity;
    for (const p of pts) { lo = Math.min(lo, p[2] - p[3]); hi = Math.max(hi, p[2] + p[3]); }
    if (!(hi > lo)) { hi = lo + 1; lo -= 1; }
    const pad = (hi - lo) * 0.05; lo -= pad; hi += pad;
    const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
    const y = (v) => T + (H - T - B) * (1 - (v - lo) / (hi - lo));

    svg.append(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
    svg.append(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
    if (lo < 0 && hi > 0) svg.append(svgEl("line", { class: "zero", x1: L, x2: W - R, y1: y(0), y2: y(0) }));
    const up = pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[2] + p[3]).toFixed(1)}`);
    const down = pts.slice().reverse().map((p) => `${x(p[0]).toFixed(1)},${y(p[2] - p[3]).toFixed(1)}`);
    svg.append(svgEl("polygon", { class: "band", points: up.concat(down).join(" ") }));
    const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[2]).toFixed(1)}`).join("");
    svg.append(svgEl("path", { class: "line", d }));
    svg.append(svgEl("circle", { class: "dot", cx: x(last[0]), cy: y(last[2]), r: 2.5 }));
    const label = (tx, ty, text, anchor) => {
      const t = svgEl("text", { x: tx, y: ty, "text-anchor": anchor });
      t.textContent = text;
      svg.append(t);
    };
    label(L - 4, T + 8, fmt(hi), "end");
    label(L - 4, H - B, fmt(lo), "end");
    label(L, H - 4, `tick ${t0}`, "start");
    label(W - R, H - 4, `tick ${pts[pts.length - 1][0]}`, "end");
  }

  // ------------------------------------------------------------------ histogram
  function barRow(name, node, max, indent) {
    const row = el("div", { class: "hist-row", "data-node": name });
    const label = el("span", { class: "name", title: `${name}: consistent ${fmt(node.value)}, noisy ${fmt(node.noisy)} ± ${fmt(node.stderr)}` }, name);
    label.style.paddingLeft = `${indent * 12}px`;
    const barbox = el("div", { class: "barbox" });
    const w = (v) => `${Math.max(0, Math.min(100, 100 * v / max))}%`;
    const bar = el("div", { class: "bar" }); bar.style.width = w(node.value);
    const noisy = el("div", { class: "noisy" }); noisy.style.left = w(node.noisy);
    barbox.append(bar, noisy);
    row.append(label, barbox, el("span", { class: "num" }, fmt(node.value)));
    return row;
  }

  function cellLabel(names, i) {
    const k = names.length;
    return names.map((n, j) => `${n}=${(i >> (k - 1 - j)) & 1}`).join(",");
  }

  function renderMarginals() {
    const m = state.marginals;
    const box = $("histogram");
    box.textContent = "";
    const diag = m.diagnostics || {};
    const clusters = m.clusters || [], bridges = m.bridges || [];
    $("hist-meta").textContent = `tick ${m.tick} · epoch ${m.epoch} · ${clusters.length} clusters · ` +
      `${bridges.length} bridges · total ${fmt(m.total)} · residual ` +
      `${diag.residual !== undefined ? Number(diag.residual).toExponential(1) : "?"}`;
    box.dataset.tick = String(m.tick);
    document.querySelector("#histogram-panel h2").firstChild.nodeValue = "Consistent tables and clusters ";
    const names = m.attributes || [];
    const chips = el("div", { class: "clusters" });
    chips.append(el("b", {}, "clusters"));
    for (const c of clusters) chips.append(el("span", { class: "cluster-chip" }, c.map((a) => names[a] ?? a).join(" · ")));
    if (bridges.length) {
      chips.append(el("b", {}, "bridges"));
      for (const b of bridges) chips.append(el("span", { class: "cluster-chip bridge" }, b.map((a) => names[a] ?? a).join(" · ")));
    }
    box.append(chips);
    const tables = (m.tables || []).filter((t) => !state.prefix || (t.names || []).some((n) => String(n).startsWith(state.prefix)));
    for (const t of tables) {
      const block = el("div", { class: "attr-table", "data-attrs": (t.attributes || []).join(",") });
      block.append(el("b", {}, `${t.kind} [${(t.names || []).join(", ")}]`),
                   el("span", { class: "hint" }, ` ±${fmt(t.stderr)} per cell${t.carried_from_model ? " (carry from the model)" : ""}`));
      const max = Math.max(1e-9, ...t.cells.map((v, i) => Math.max(v, t.noisy[i])));
      block.append(el("div", { class: "hint" }, `cells: ${(t.names || []).join(" ")} = bits`));
      t.cells.forEach((v, i) => {
        const full = cellLabel(t.names || [], i);
        const bits = i.toString(2).padStart((t.names || []).length, "0").split("").join(" ");
        const row = barRow(bits, { value: v, noisy: t.noisy[i], stderr: t.stderr }, max, 1);
        row.dataset.node = full;
        row.title = `${full}: consistent ${fmt(v)}, noisy ${fmt(t.noisy[i])} ± ${fmt(t.stderr)}`;
        block.append(row);
      });
      box.append(block);
    }
  }

  function renderHistogram() {
    if (state.marginals && !state.histogram) return renderMarginals();
    const h = state.histogram;
    const box = $("histogram");
    if (!h) return;
    box.textContent = "";
    const nodes = (h.nodes || []).filter((n) => String(n.stream).startsWith(state.prefix));
    const diag = h.diagnostics || {};
    $("hist-meta").textContent = `tick ${h.tick} · ${h.consistent ? "consistent" : "not consistent"} · ` +
      `${diag.iterations ?? "?"} iteration${diag.iterations === 1 ? "" : "s"} · residual ${diag.residual !== undefined ? Number(diag.residual).toExponential(1) : "?"}`;
    box.dataset.tick = String(h.tick);
    const max = Math.max(1e-9, ...nodes.map((n) => Math.max(n.value, n.noisy)));
    const isGrid = nodes.some((n) => String(n.stream).includes("|"));
    if (isGrid) return renderGrid(box, nodes, max);
    const first = nodes.length ? String(nodes[0].stream) : "";
    const hasRoot = nodes.length > 1 && !first.includes("/") && (first === "all" || first === "total" || nodes.some((n) => String(n.stream).includes("/")));
    const rest = nodes.slice(hasRoot ? 1 : 0).sort((a, b) => (a.stream < b.stream ? -1 : a.stream > b.stream ? 1 : 0));
    const frag = document.createDocumentFragment();
    if (hasRoot) frag.append(barRow(first, nodes[0], max, 0));
    for (const n of rest) {
      const name = String(n.stream);
      frag.append(barRow(name, n, max, (hasRoot ? 1 : 0) + (name.split("/").length - 1)));
    }
    box.append(frag);
  }

  function renderGrid(box, nodes, max) {
    const byName = new Map(nodes.map((n) => [String(n.stream), n]));
    const total = byName.get("total");
    if (total) box.append(barRow("total", total, max, 0));
    const attrs = new Map();  // attribute -> [category, ...] in order of appearance
    for (const n of nodes) {
      const name = String(n.stream);
      if (name.includes("|") || !name.includes("=")) continue;
      const [a, c] = name.split("=", 2);
      if (!attrs.has(a)) attrs.set(a, []);
      attrs.get(a).push(c);
    }
    const marginalMax = Math.max(1e-9, ...nodes.filter((n) => !String(n.stream).includes("|") && String(n.stream) !== "total").map((n) => Math.max(n.value, n.noisy)));
    for (const [a, cats] of attrs) {
      const block = el("div", { class: "attr" });
      block.append(el("b", {}, a));
      for (const c of cats) block.append(barRow(`${a}=${c}`, byName.get(`${a}=${c}`), marginalMax, 1));
      box.append(block);
    }
    const names = [...attrs.keys()];
    if (names.length >= 2) {
      const [a, b] = names;
      const table = el("table", { class: "grid-table" });
      const head = el("tr");
      head.append(el("th", {}, `${a} \\ ${b}`));
      for (const cb of attrs.get(b)) head.append(el("th", {}, cb));
      table.append(head);
      for (const ca of attrs.get(a)) {
        const tr = el("tr");
        tr.append(el("th", {}, ca));
        for (const cb of attrs.get(b)) {
          let sum = 0;
          for (const n of nodes) {
            const parts = String(n.stream).split("|");
            if (parts.length >= 2 && parts.includes(`${a}=${ca}`) && parts.includes(`${b}=${cb}`)) sum += n.value;
          }
          tr.append(el("td", {}, fmt(sum)));
        }
        table.append(tr);
      }
      const cap = el("p", { class: "hint" }, names.length > 2 ? `cells summed over ${names.slice(2).join(", ")}` : "cells");
      box.append(cap, table);
    }
  }

  // ------------------------------------------------------------------ connection
  function connect() {
    if (state.source) state.source.close();
    const url = "events" + (state.prefix ? `?prefix=${encodeURIComponent(state.prefix)}` : "");
    const src = new EventSource(url);
    state.source = src;
    src.addEventListener("open", () => renderStatus("connected, waiting for releases…", "connecting"));
    src.addEventListener("error", () => renderStatus("disconnected, retrying…", "error"));
    src.addEventListener("snapshot", (ev) => {
      const snap = JSON.parse(ev.data);
      state.series.clear();
      for (const [name, s] of Object.entries(snap.streams || {})) {
        for (const p of s.points) addPoint(name, p, s.meta);
      }
      if (snap.histogram) state.histogram = snap.histogram;
      if (snap.marginals) state.marginals = snap.marginals;
      if (Array.isArray(snap.budget_units) && snap.budget_units.length) state.budgetUnits = snap.budget_units;
      if (snap.meta) state.meta = snap.meta;
      if (snap.status && Number.isFinite(snap.status.messages)) state.messages = snap.status.messages;
      applyStatus(snap.status);
      listDirty = chartsDirty = histDirty = true;
      schedule();
    });
    src.addEventListener("counts", (ev) => {
      const rows = JSON.parse(ev.data);
      for (const r of rows) addPoint(r[0], r.slice(1));
      state.messages += rows.length;
      chartsDirty = true;
      renderStatus("live", "live");
      schedule();
    });
    src.addEventListener("histogram", (ev) => {
      state.histogram = JSON.parse(ev.data);
      state.messages += 1;
      histDirty = true;
      renderStatus("live", "live");
      schedule();
    });
    src.addEventListener("marginals", (ev) => {
      state.marginals = JSON.parse(ev.data);
      state.messages += 1;
      histDirty = true;
      renderStatus("live", "live");
      schedule();
    });
    src.addEventListener("meta", (ev) => { state.meta = JSON.parse(ev.data); });
    src.addEventListener("status", (ev) => applyStatus(JSON.parse(ev.data)));
  }

  function applyStatus(st) {
    if (!st) return;
    if (st.error) renderStatus(st.error, "error");
    else if (st.connected) renderStatus("live", "live");
    schedule();
  }

  let filterTimer = 0;
  $("filter").addEventListener("input", (ev) => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => {
      state.prefix = ev.target.value.trim();
      state.selected = [];
      state.userSelected = false;
      connect();
    }, 300);
  });

  window.streamDpDashboard = state;  // for debugging and the browser test
  connect();
})();
