// fedweave dashboard: draws each page from its JSON (the shell's #initial, then short polls
// of the same JSON) with uPlot charts. Data is only ever set as text, never as HTML.
"use strict";
(function () {
  const page = document.body.dataset.page;
  const pollMs = Number(document.body.dataset.pollMs) || 2000;
  const initial = JSON.parse(document.getElementById("initial").textContent);
  const main = document.getElementById("main");
  const statusLine = document.getElementById("status");
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2",
    "#db2777", "#4b5563"];
  const OUTCOME_COLORS = { ok: "#16a34a", late: "#d97706", rejected: "#7c3aed",
    failed: "#dc2626", refused: "#db2777", lost: "#4b5563" };

  // --- small DOM helpers --------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function put(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  }
  function num(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value) && Math.abs(value) < 1e6) return String(value);
    return Number(value).toPrecision(digits || 4).replace(/\.?0+(e|$)/, "$1");
  }
  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return d.toISOString().replace("T", " ").slice(0, 19) + "Z";
  }
  function ago(iso, now) {
    if (!iso) return "never";
    const s = Math.max(0, (now - new Date(iso).getTime()) / 1000);
    if (s < 90) return `${Math.round(s)} s ago`;
    if (s < 5400) return `${Math.round(s / 60)} min ago`;
    return `${(s / 3600).toFixed(1)} h ago`;
  }
  function table(headers, rows, attrs) {
    return el("table", attrs || {},
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows));
  }
  function badge(run) {
    const label = run.looks_dead ? "running? (no heartbeat)" : run.status;
    const cls = run.alert ? "badge alert" : `badge s-${run.status}${run.looks_dead ? " dead" : ""}`;
    return el("span", { class: cls, text: run.alert ? `${label} · alert` : label });
  }
  function protectionsText(p, mode) {
    if (!p || Object.keys(p).length === 0) return mode === "gossip" ? "gossip (peer-to-peer)" : "–";
    const parts = [];
    const s = p.secure_aggregation || {};
    parts.push(s.on ? `SecAgg+ on (${s.shares} shares, threshold ${s.threshold})` : "SecAgg+ OFF");
    parts.push(p.tls === null || p.tls === undefined ? "TLS n/a (simulation)" : `TLS ${p.tls ? "on" : "OFF"}`);
    if (p.site_authentication !== null && p.site_authentication !== undefined)
      parts.push(`site keys ${p.site_authentication ? "required" : "OFF"}`);
    const dp = p.differential_privacy || {};
    parts.push(`DP ${dp.mode || "none"}`);
    return parts.join(" · ");
  }
  function setStatus(text, bad) {
    statusLine.textContent = text;
    statusLine.className = bad ? "bad" : "";
  }
  async function getJson(url) {
    const response = await fetch(url, { headers: { accept: "application/json" }, cache: "no-store" });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
    return body;
  }
  function poll(url, apply, every) {
    let timer = null;
    async function tick() {
      try {
        apply(await getJson(typeof url === "function" ? url() : url));
        setStatus(`live · updated ${new Date().toLocaleTimeString()}`, false);
      } catch (error) {
        setStatus(`not updated: ${error.message}`, true);
      }
      timer = setTimeout(tick, every || pollMs);
    }
    timer = setTimeout(tick, every || pollMs);
    return () => clearTimeout(timer);
  }

  // --- charts -------------------------------------------------------------------------
  function chartWidth(container) {
    const room = container.clientWidth || 900;
    const perRow = Math.max(1, Math.floor(room / 420));
    return Math.max(300, Math.min(560, Math.floor(room / perRow) - 30));
  }
  // A chart of series over rounds. series: [{label, color, values: Map(round -> value)}]
  class Chart {
    constructor(container, title, seriesDefs, opts) {
      this.title = title;
      this.defs = seriesDefs;
      this.box = el("figure", { class: "chart", "data-title": title },
        el("figcaption", { text: title }));
      container.append(this.box);
      this.plot = new uPlot({
        width: chartWidth(container), height: (opts && opts.height) || 200,
        scales: { x: { time: false } },
        legend: { live: false },
        axes: [{ label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] },
          { size: 56 }],
        series: [{ label: "round" }, ...seriesDefs.map((s) => ({
          label: s.label, stroke: s.color, width: 1.5, spanGaps: true,
          points: { show: false }, paths: s.step ? uPlot.paths.stepped({ align: 1 }) : undefined,
        }))],
      }, [[]], this.box);
    }
    set(valuesBySeries) {
      const rounds = new Set();
      for (const values of valuesBySeries) for (const r of values.keys()) rounds.add(r);
      const xs = [...rounds].sort((a, b) => a - b);
      this.plot.setData([xs, ...valuesBySeries.map((v) => xs.map((r) => (v.has(r) ? v.get(r) : null)))]);
      this.box.dataset.points = String(xs.length);
    }
  }
  function metricGroups(names) {
    // central.auc, federated.auc, train.loss ... -> {auc: [central.auc, federated.auc], ...}
    const groups = new Map();
    for (const name of names) {
      const dot = name.indexOf(".");
      if (dot < 0) continue; // bare headline names: the compare view's
      const bare = name.slice(dot + 1);
      if (!groups.has(bare)) groups.set(bare, []);
      groups.get(bare).push(name);
    }
    const order = (n) => (n === "loss" ? 0 : n === "accuracy" ? 1 : 2);
    return [...groups.entries()].sort((a, b) => order(a[0]) - order(b[0]) || a[0].localeCompare(b[0]));
  }

  // --- the runs list ------------------------------------------------------------------
  function runsPage(data) {
    put(main, el("h1", { text: "runs" }));
    const holder = el("div");
    const compare = el("button", { type: "button", disabled: true, text: "compare selected",
      onclick: () => {
        const ids = [...holder.querySelectorAll("input:checked")].map((i) => i.value);
        window.location.href = "/compare?" + ids.map((id) => `run=${encodeURIComponent(id)}`).join("&");
      } });
    main.append(el("p", { class: "muted" }, "tick runs to ", compare), holder);
    function draw(d) {
      const now = Date.now();
      const checked = new Set([...holder.querySelectorAll("input:checked")].map((i) => i.value));
      const rows = d.runs.map((run) => el("tr", { class: run.alert ? "alert-row" : null, "data-run": run.run_id },
        el("td", {}, el("input", { type: "checkbox", value: run.run_id, checked: checked.has(run.run_id),
          "aria-label": `select ${run.run_id}`,
          onchange: () => { compare.disabled = holder.querySelectorAll("input:checked").length < 2; } })),
        el("td", {}, el("a", { href: `/runs/${encodeURIComponent(run.run_id)}`, text: run.run_id })),
        el("td", { text: run.mode }), el("td", { text: run.task }), el("td", {}, badge(run)),
        el("td", { text: run.strategy || "–" }),
        el("td", { class: "small", text: protectionsText(run.protections, run.mode) }),
        el("td", {}, progress(run)),
        el("td", { class: "small", text: when(run.started_at) }),
        el("td", { class: "small", text: run.ended_at ? when(run.ended_at) : ago(run.heartbeat_at, now) }),
      ));
      put(holder, d.runs.length ? table(
        ["", "run", "mode", "task", "status", "strategy", "protections", "progress", "started", "ended / last heard"],
        rows, { id: "runs" }) : el("p", { text: "no runs recorded in this history yet" }));
      const studies = d.studies || [];
      if (studies.length) {
        // operators' studies (fedweave run submit): queued ones have no run yet
        const studyRows = studies.slice().reverse().map((s) => el("tr", { "data-study": String(s.id) },
          el("td", { text: String(s.id) }),
          el("td", {}, el("span", { class: `badge s-${s.state}`, text: s.state })),
          el("td", { text: s.operator }), el("td", { text: s.source }),
          el("td", {}, s.run_id ? el("a", { href: `/runs/${encodeURIComponent(s.run_id)}`, text: s.run_id }) : el("span", { class: "muted", text: "–" })),
          el("td", { class: "small", text: s.state === "queued" ? `${s.ahead} ahead` : (s.reason || "") }),
          el("td", { class: "small", text: when(s.submitted_at) }),
        ));
        holder.append(el("h2", { text: "studies submitted by operators" }),
          table(["#", "state", "operator", "study", "run", "waits / why", "submitted"], studyRows, { id: "studies" }));
      }
      const sites = d.sites || [];
      if (sites.length) {
        // each site's current jobs: the running runs whose latest round asked it
        const siteRows = sites.map((s) => el("tr", { "data-site": s.site },
          el("td", { text: s.site }),
          el("td", {}, ...s.runs.map((r) => el("span", { class: `badge s-${r.status === "ok" ? "running" : "failed"}`,
            text: `${r.run_id} (${r.task}, round ${r.round}: ${r.status})` }))),
        ));
        holder.append(el("h2", { text: "sites now" }),
          table(["site", "running runs that asked it last round"], siteRows, { id: "site-jobs" }));
      }
      performance.mark("fedweave-drawn");
    }
    draw(data);
    poll("/api/runs", draw, pollMs * 2);
  }
  function progress(run) {
    const planned = run.rounds_planned || 0;
    const done = run.rounds_completed || 0;
    const label = planned ? `${done}/${planned}` : `${done}`;
    if (!planned) return el("span", { text: label });
    return el("span", { class: "progress" },
      el("progress", { max: String(planned), value: String(Math.min(done, planned)) }), " ", label);
  }

  // --- one run ------------------------------------------------------------------------
  async function runPage(shell) {
    const url = `/api/runs/${encodeURIComponent(shell.run_id)}`;
    let data;
    while (!data) {
      try {
        data = await getJson(url);
      } catch (error) {
        setStatus(`not loaded: ${error.message}; trying again`, true);
        await new Promise((resolve) => setTimeout(resolve, pollMs));
      }
    }
    const run = data.run;
    const rounds = new Map();
    const head = el("div");
    const alerts = el("div", { id: "alerts" });
    const flight = el("div", { id: "in-flight" });
    const best = el("p", { id: "best" });
    const charts = el("div", { class: "charts", id: "charts" });
    const sites = el("section", { id: "sites" });
    const matrix = el("section", { id: "cross-site" });
    const recent = el("section", { id: "rounds" });
    const config = el("details", {}, el("summary", { text: "settings" }), el("pre", { text: JSON.stringify(run.config, null, 2) }));
    put(main, head, alerts, flight, best, charts, sites, matrix, recent, config);
    const gossip = run.mode === "gossip";
    let chartSet = null;
    let known = [];

    function drawHead(d) {
      const r = d.run;
      put(head, 
        el("h1", {}, `run ${r.run_id} `, badge(Object.assign({}, r, { alert: d.alerts && d.alerts.any }))),
        el("p", {}, `${r.mode} · ${r.task} · ${r.strategy || ""} · `, progress(r),
          ` rounds · started ${when(r.started_at)}`, r.ended_at ? ` · ended ${when(r.ended_at)}` : ""),
        el("p", { class: "small" }, protectionsText(r.protections, r.mode)),
        ...(r.reason ? [el("p", { class: "reason", text: `reason: ${r.reason}` })] : []));
    }
    function drawAlerts(d) {
      const a = d.alerts || {};
      const lines = [];
      if (a.waiting) lines.push(a.waiting.line);
      if (a.overdue) lines.push(a.overdue.line);
      for (const s of a.late_sites || []) lines.push(s.line);
      put(alerts, ...lines.map((line) => el("p", { class: "alert", role: "alert", text: line })));
    }
    let flightTimer = null;
    function drawFlight(d) {
      clearInterval(flightTimer);
      const f = d.in_flight;
      if (!f) { put(flight); return; }
      const skew = Date.now() - new Date(d.server_time).getTime();
      const started = new Date(f.started_at).getTime() + skew;
      const line = el("p", { class: "flight" });
      function tick() {
        const running = (Date.now() - started) / 1000;
        let text = `round ${f.round} in flight: ${f.sampled} of ${f.connected} connected sites asked, ${Math.round(running)} s running`;
        if (f.deadline_seconds !== null) {
          const left = f.deadline_seconds - running;
          text += left >= 0 ? `; training deadline in ${Math.ceil(left)} s` :
            `; training deadline (${num(f.deadline_seconds)} s) passed ${Math.round(-left)} s ago (evaluation follows)`;
          line.classList.toggle("late", left < 0);
        }
        line.textContent = text;
      }
      tick();
      flightTimer = setInterval(tick, 1000);
      put(flight, line);
    }
    function buildCharts(names) {
      put(charts);
      const made = [];
      const metricCharts = gossip
        ? ["peers.accuracy", "peers.loss", "consensus"].filter((n) => names.includes(n)).map((n) => [n, [n]])
        : metricGroups(names);
      for (const [bare, members] of metricCharts) {
        const title = members.length === 1 ? members[0] : bare;
        made.push({ chart: new Chart(charts, title, members.map((m, i) => ({ label: m, color: PALETTE[i % PALETTE.length] }))),
          values: (r) => members.map((m) => r.metrics[m]) });
      }
      made.push({ chart: new Chart(charts, "seconds per round", [
        { label: "seconds", color: PALETTE[0] }, ...(gossip ? [] : [{ label: "deadline", color: "#9ca3af", step: true }])]),
        values: (r) => [r.seconds, ...(gossip ? [] : [r.deadline_seconds])] });
      if (gossip) {
        made.push({ chart: new Chart(charts, "exchanges per round", [
          { label: "answered", color: OUTCOME_COLORS.ok }, { label: "missed", color: OUTCOME_COLORS.failed },
          { label: "drops", color: OUTCOME_COLORS.late }], { height: 180 }),
          values: (r) => [r.answered, r.missed, r.drops] });
      } else {
        const outcomes = ["ok", "late", "rejected", "failed", "refused", "lost"];
        made.push({ chart: new Chart(charts, "sites per round",
          outcomes.map((o) => ({ label: o, color: OUTCOME_COLORS[o], step: true })), { height: 180 }),
          values: (r) => outcomes.map((o) => r.outcomes[o] || 0) });
      }
      return made;
    }
    function drawCharts() {
      const all = [...rounds.values()].sort((a, b) => a.round - b.round);
      for (const { chart, values } of chartSet) {
        const maps = chart.defs.map(() => new Map());
        for (const r of all) values(r).forEach((v, i) => { if (v !== null && v !== undefined) maps[i].set(r.round, v); });
        chart.set(maps);
      }
    }
    function drawSites(d) {
      const now = Date.now();
      if (gossip) {
        put(sites, el("h2", { text: "peers" }), table(
          ["peer", "rounds", "last round", "accuracy", "loss", "missed exchanges", "drops", "last heard"],
          (d.peers || []).map((p) => el("tr", {}, el("td", { text: p.peer }), el("td", { text: num(p.rounds) }),
            el("td", { text: num(p.last_round) }), el("td", { text: num(p.accuracy) }), el("td", { text: num(p.loss) }),
            el("td", { text: num(p.missed) }), el("td", { text: num(p.drops) }), el("td", { text: ago(p.last_seen_at, now) })))));
        return;
      }
      const lateNow = new Set(((d.alerts || {}).late_sites || []).map((s) => s.site));
      const rows = (d.sites || []).map((s) => {
        const lastProblem = s.problems.length ? s.problems[s.problems.length - 1] : null;
        const metricNames = Object.keys(s.last_metrics).sort().slice(0, 4);
        return el("tr", { class: lateNow.has(s.site) ? "alert-row" : null, "data-site": s.site },
          el("td", {}, el("a", { href: `/runs/${encodeURIComponent(run.run_id)}/sites/${encodeURIComponent(s.site)}`, text: s.site })),
          el("td", { text: ago(s.last_seen_at, now) }), el("td", { text: num(s.rounds) }), el("td", { text: num(s.examples) }),
          el("td", { class: "small", text: ["late", "rejected", "failed", "refused", "lost"].filter((k) => s.counts[k])
            .map((k) => `${k} ${s.counts[k]}`).join(", ") || "–" }),
          el("td", { class: "small", text: metricNames.map((m) => `${m} ${num(s.last_metrics[m])}`).join(", ") || "–" }),
          el("td", { class: "small reason", text: lastProblem ? `round ${lastProblem.round} ${lastProblem.part} ${lastProblem.status}: ${lastProblem.reason || "no reason given"}` : "–" }));
      });
      put(sites, el("h2", { text: "sites" }), rows.length ? table(
        ["site", "last seen", "rounds", "examples", "late / rejected / failed", "last metrics", "last problem"], rows, { id: "sites-table" })
        : el("p", { class: "muted", text: "no site has reported yet" }));
    }
    function drawMatrix(d) {
      const entries = d.cross_site;
      if (!entries || !entries.length) { put(matrix); return; }
      const metrics = [...new Set(entries.flatMap((e) => Object.keys(e.metrics)))].sort();
      const select = el("select", { "aria-label": "cross-site metric" }, metrics.map((m) => el("option", { value: m, text: m })));
      const holder = el("div");
      const models = [...new Set(entries.map((e) => e.model))];
      const siteNames = [...new Set(entries.map((e) => e.site))].sort();
      function drawTable() {
        const m = select.value;
        put(holder, table(["model \\ site", ...siteNames], models.map((model) => el("tr", {},
          el("th", { text: model }), siteNames.map((site) => {
            const e = entries.find((x) => x.model === model && x.site === site);
            if (!e) return el("td", { text: "–" });
            return el("td", { title: e.reason || "", text: e.status === "ok" ? num(e.metrics[m]) : e.status });
          })))));
      }
      select.addEventListener("change", drawTable);
      if (metrics.includes("loss")) select.value = "loss";
      drawTable();
      put(matrix, el("h2", { text: "cross-site evaluation" }), el("p", {}, "metric ", select), holder);
    }
    function drawRecent() {
      const all = [...rounds.values()].sort((a, b) => b.round - a.round).slice(0, 20);
      const headline = (r) => ["accuracy", "loss"].map((m) => `${m} ${num(r.metrics[m])}`).join(", ")
        + (r.metrics["privacy.epsilon"] != null ? `, epsilon ${num(r.metrics["privacy.epsilon"])}` : "");
      put(recent, el("h2", { text: "latest rounds" }), table(
        gossip ? ["round", "peers", "seconds", "exchanges", "missed", "drops", "mean accuracy / loss", "consensus"]
          : ["round", "ended", "seconds", "sites ok", "late", "failed / rejected", "headline", "notes"],
        all.map((r) => gossip
          ? el("tr", {}, el("td", { text: r.round }), el("td", { text: r.peers }), el("td", { text: num(r.seconds, 3) }),
            el("td", { text: r.exchanges }), el("td", { text: r.missed }), el("td", { text: r.drops }),
            el("td", { text: headline(r) }), el("td", { text: num(r.metrics.consensus) }))
          : el("tr", {}, el("td", { text: r.round }), el("td", { class: "small", text: when(r.ended_at) }),
            el("td", { text: num(r.seconds, 3) }), el("td", { text: `${r.replied}/${r.sampled}` }),
            el("td", { text: r.outcomes.late || 0 }), el("td", { text: `${r.outcomes.failed || 0} / ${r.outcomes.rejected || 0}` }),
            el("td", { text: headline(r) }),
            el("td", { class: "small reason", text: [r.failed, ...(r.warnings || [])].filter(Boolean).join("; ") || "" })))));
    }
    // Redraw only what a poll changed: a page left open on a live run costs its browser
    // little (and the sites' machine nothing, where the browser runs beside them).
    let shown = { state: "", matrix: "" };
    function apply(d) {
      const fresh = d.rounds.filter((r) => JSON.stringify(rounds.get(r.round)) !== JSON.stringify(r));
      for (const r of fresh) rounds.set(r.round, r);
      const names = d.metric_names || [];
      if (!chartSet || names.join() !== known.join()) { known = names; chartSet = buildCharts(names); fresh.push(null); }
      const state = JSON.stringify([d.run, d.alerts, d.in_flight, d.sites, d.peers, d.best]);
      if (state !== shown.state) {
        drawHead(d); drawAlerts(d); drawFlight(d); drawSites(d);
        best.textContent = d.best ? `best round ${d.best.round} by ${d.best.metric}: ${num(d.best.value)}` : "";
        shown.state = state;
      }
      if (fresh.length) { drawCharts(); drawRecent(); }
      const matrixKey = JSON.stringify(d.cross_site || null);
      if (!gossip && matrixKey !== shown.matrix) { drawMatrix(d); shown.matrix = matrixKey; }
      main.dataset.rounds = String(rounds.size);
      performance.mark("fedweave-drawn");
    }
    apply(data);
    setStatus(`live · updated ${new Date().toLocaleTimeString()}`, false);
    const lastRound = () => Math.max(0, ...rounds.keys());
    poll(() => `/api/runs/${encodeURIComponent(run.run_id)}?after=${lastRound()}`, apply);
  }

  // --- one site -----------------------------------------------------------------------
  function sitePage(data) {
    const runLink = `/runs/${encodeURIComponent(data.run.run_id)}`;
    const charts = el("div", { class: "charts" });
    const training = new Map(), evaluation = new Map();
    for (const h of data.history) for (const [k, v] of Object.entries(h.metrics)) {
      if (!k.startsWith("train_")) continue;
      if (!training.has(k)) training.set(k, new Map());
      training.get(k).set(h.round, v);
    }
    for (const e of data.evaluations) if (e.status === "ok") for (const [k, v] of Object.entries(e.metrics)) {
      if (typeof v !== "number") continue;
      if (!evaluation.has(k)) evaluation.set(k, new Map());
      evaluation.get(k).set(e.round, v);
    }
    const streak = data.late_streak || [];
    put(main, 
      el("h1", { text: `site ${data.site}` }),
      el("p", {}, "in run ", el("a", { href: runLink, text: data.run.run_id }), ` (${data.run.task}, ${data.run.status})`),
      el("p", { text: `took part in ${data.rounds} rounds; ${num(data.examples)} examples in its last; last seen round ${num(data.last_seen_round)} (${when(data.last_seen_at)})` }),
      streak.length ? el("p", { class: "alert", role: "alert", text: `late ${streak.length} rounds in a row (rounds ${streak[0]}-${streak[streak.length - 1]})` }) : null,
      charts,
      el("h2", { text: "refused, rejected, failed or late" }),
      data.problems.length ? table(["round", "part", "status", "reason"], data.problems.slice().reverse().map((p) => el("tr", {},
        el("td", { text: p.round }), el("td", { text: p.part }), el("td", { text: p.status }), el("td", { class: "reason", text: p.reason || "no reason given" }))), { id: "problems" })
        : el("p", { class: "muted", text: "none" }),
      el("h2", { text: "every round" }),
      table(["round", "status", "examples", "seconds", "reason"], data.history.slice().reverse().map((h) => el("tr", {},
        el("td", { text: h.round }), el("td", { text: h.status }), el("td", { text: num(h.examples) }),
        el("td", { text: num(h.seconds, 3) }), el("td", { class: "reason", text: h.reason || "" })))));
    for (const [title, series] of [["training", training], ["evaluation of the global model", evaluation]]) {
      if (!series.size) continue;
      const names = [...series.keys()].sort();
      const chart = new Chart(charts, title, names.map((n, i) => ({ label: n, color: PALETTE[i % PALETTE.length] })));
      chart.set(names.map((n) => series.get(n)));
    }
    performance.mark("fedweave-drawn");
  }

  // --- compare ------------------------------------------------------------------------
  function comparePage(data) {
    const chosen = new Set(data.runs.map((r) => r.run_id));
    const form = el("form", { method: "get", action: "/compare", class: "choices" },
      data.choices.map((c) => el("label", {}, el("input", { type: "checkbox", name: "run", value: c.run_id, checked: chosen.has(c.run_id) }),
        ` ${c.run_id} · ${c.mode} · ${c.task} · ${c.strategy || ""} · ${c.status}`)),
      el("button", { type: "submit", text: "compare" }));
    const charts = el("div", { class: "charts", id: "charts" });
    put(main, el("h1", { text: "compare runs" }), form, charts);
    if (data.runs.length === 0) { charts.append(el("p", { class: "muted", text: "tick two or more runs" })); return; }
    const label = (r) => `${r.run_id} ${r.mode === "gossip" ? "gossip" : r.strategy || r.mode}`;
    const order = (n) => (n === "accuracy" ? 0 : n === "loss" ? 1 : 2);
    const names = data.metric_names.slice().sort((a, b) => order(a) - order(b) || a.localeCompare(b));
    for (const name of names) {
      const runs = data.runs.filter((r) => r.rounds.some((x) => x.metrics[name] !== undefined));
      if (runs.length === 0) continue;
      const chart = new Chart(charts, name, runs.map((r, i) => ({ label: label(r), color: PALETTE[i % PALETTE.length] })));
      chart.set(runs.map((r) => new Map(r.rounds.filter((x) => x.metrics[name] !== undefined).map((x) => [x.round, x.metrics[name]]))));
    }
    performance.mark("fedweave-drawn");
  }

  // --- a site's own view (fedweave client --status-address) ----------------------------
  function statusPage(data) {
    function metricsText(m) {
      return Object.keys(m || {}).sort().map((k) => `${k} ${num(m[k])}`).join(", ") || "–";
    }
    function floorText(f) {
      const parts = [];
      if (f.require_secure_agg) parts.push("requires SecAgg+");
      if (f.require_dp && f.require_dp !== "off") parts.push(`requires DP (${f.require_dp})`);
      if (f.max_epsilon != null) parts.push(`at most epsilon ${f.max_epsilon}`);
      return parts.join(" · ") || "none (takes part in any run)";
    }
    function draw(d) {
      const c = d.connection;
      const now = Date.now();
      put(main,
        el("h1", {}, `site ${d.site} `, el("span", { class: `badge s-${c.state === "connected" ? "running" : "failed"}`, id: "connection", text: c.state })),
        el("p", { text: `coordinator ${d.coordinator} · ${c.state} since ${ago(c.since, now)}${c.detail ? ` (${c.detail})` : ""} · started ${when(d.started_at)}` }),
        el("p", { id: "privacy-floor", text: `privacy floor: ${floorText(d.privacy_floor || {})}` }),
        el("h2", { text: "runs" }),
        d.runs.length ? table(["run", "rounds trained", "examples", "evaluations", "last round", "training metrics", "evaluation metrics", ""],
          d.runs.map((r) => el("tr", {}, el("td", { text: r.run }), el("td", { text: r.rounds_trained }), el("td", { text: num(r.examples) }),
            el("td", { text: r.evaluations }), el("td", { text: r.last_round || "–" }), el("td", { class: "small", text: metricsText(r.training_metrics) }),
            el("td", { class: "small", text: metricsText(r.evaluation_metrics) }), el("td", { text: r.ended ? "ended" : "" }))), { id: "site-runs" })
          : el("p", { class: "muted", text: "not asked to take part yet" }),
        el("h2", { text: "refused, rejected or failed here" }),
        d.problems.length ? table(["when", "run", "round", "part", "outcome", "reason"], d.problems.map((p) => el("tr", {},
          el("td", { class: "small", text: when(p.at) }), el("td", { text: p.run || "–" }), el("td", { text: p.round || "–" }),
          el("td", { text: p.part }), el("td", { text: p.outcome }), el("td", { class: "reason", text: p.reason || "no reason given" }))), { id: "site-problems" })
          : el("p", { class: "muted", text: "none" }),
        el("h2", { text: "latest messages" }),
        table(["when", "run", "round", "part", "outcome", "examples", "metrics", "sent"], d.recent.map((r) => el("tr", {},
          el("td", { class: "small", text: when(r.at) }), el("td", { text: r.run || "–" }), el("td", { text: r.round || "–" }),
          el("td", { text: r.part }), el("td", { text: r.outcome }), el("td", { text: num(r.examples) }),
          el("td", { class: "small", text: metricsText(r.metrics) }), el("td", { text: r.outcome === "ok" ? (r.masked ? "masked (SecAgg+)" : "in the clear") : "" })))));
      performance.mark("fedweave-drawn");
    }
    draw(data);
    poll("/api/status", draw);
  }

  function missingPage(data) {
    put(main, el("h1", { text: "not found" }), el("p", { class: "reason", id: "message", text: data.message }),
      el("p", {}, el("a", { href: "/", text: "all runs" })));
  }

  const pages = { runs: runsPage, run: runPage, site: sitePage, compare: comparePage, status: statusPage,
    missing: missingPage };
  (pages[page] || missingPage)(initial);
})();
