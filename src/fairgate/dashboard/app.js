/* fairgate dashboard.
 *
 * Vanilla JS, no build step, no third-party code: everything comes from this gateway's admin API
 * (/api, with the admin key the operator typed, kept in sessionStorage) and its /health.
 * Hash routes: #/pools, #/keys, #/combos, #/plans, #/health, #/settings. The DOM is built with createElement and textContent
 * only (never innerHTML), so a name in the data can never become markup.
 */
(function () {
  "use strict";

  const KEY_STORE = "fairgate.adminKey";
  const CONCEPT_STORE = "fairgate.conceptClosed";
  const REFRESH_MS = 30000;
  const ROOT = new URL("../", document.baseURI).pathname; // the gateway root, prefix-proof
  const UNITS = ["requests", "tokens", "usd", "percent"];
  const WINDOWS = ["hourly", "5h", "daily", "weekly", "monthly"];
  const POLICIES = ["hard", "soft", "burst"];
  const ID_RE = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
  const PALETTE = 8;
  const SVG_NS = "http://www.w3.org/2000/svg";

  /* Pages with a form being filled in: the periodic refresh leaves them alone. */
  const EDITING = new Set(["plans", "settings"]);

  const state = {
    key: sessionStorage.getItem(KEY_STORE) || "",
    route: "pools",
    timer: null,
    loading: false,
    pending: false,
    threshold: 0.5,
    dimChoice: {}, // pool id -> chosen dimension key for the table and chart
    planConn: null,
    data: { pools: [], usage: {}, usageErr: {}, logs: {}, connections: null, keys: [] }, // connections: null until first read
  };

  // -- small DOM helpers -------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    append(el, children);
    return el;
  }

  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    append(el, children);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.setAttribute("class", v);
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
      else if (k === "style") Object.assign(el.style, v); // CSSOM: allowed by the page's CSP
      else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
  }

  const $ = (sel, root) => (root || document).querySelector(sel);
  let uid = 0;
  const nextId = (prefix) => `${prefix}-${++uid}`;

  // -- formatting ----------------------------------------------------------------------------

  const nf1 = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
  const nf2 = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });
  const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });
  const UNIT_SHORT = { requests: "req", tokens: "tokens", usd: "USD", percent: "%" };

  function num(n, unit) {
    if (n === null || n === undefined || Number.isNaN(n)) return "–";
    if (unit === "usd") return "$" + nf2.format(n);
    if (Math.abs(n) >= 100000) return compact.format(n);
    return Math.abs(n) < 10 ? nf2.format(n) : nf1.format(n);
  }

  function pct(f) {
    return nf1.format(f * 100) + " %";
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    const min = Math.round(ms / 60000);
    if (ms < 60000) return "under a minute";
    if (min < 60) return `${min} min`;
    const hrs = Math.floor(min / 60);
    if (hrs < 48) return `${hrs} h ${min % 60} min`;
    return `${Math.floor(hrs / 24)} d ${hrs % 24} h`;
  }

  const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  const title = (s) => String(s).replace(/[_-]+/g, " ").replace(/([a-z])([A-Z])/g, "$1 $2").replace(/^./, (c) => c.toUpperCase());

  // -- API -----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message, fields) {
      super(message);
      this.status = status;
      this.fields = fields || [];
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + state.key, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(ROOT + "api" + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
    } catch (err) {
      throw new ApiError(0, "Cannot reach the gateway: is it running?");
    }
    const data = await res.json().catch(() => null);
    if (res.status === 401 || res.status === 403) {
      const msg = (data && data.error && data.error.message) || "the admin key was not accepted";
      signOut(`Signed out: ${msg}.`);
      throw new ApiError(401, msg);
    }
    if (!res.ok) {
      const err = (data && data.error) || {};
      throw new ApiError(res.status, err.message || `HTTP ${res.status}`, err.fields);
    }
    return data;
  }

  // -- toast -----------------------------------------------------------------------------------

  let toastTimer = null;
  function toast(text) {
    const el = $("#toast");
    el.textContent = text;
    el.classList.add("show");
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => el.classList.remove("show"), 4000);
  }

  // -- sign in / out -------------------------------------------------------------------------

  function showSignin(message) {
    $("#app-view").hidden = true;
    $("#nav").hidden = true;
    $("#session").hidden = true;
    $("#signin-view").hidden = false;
    $("#signin-error").textContent = message || "";
    $("#admin-key").setAttribute("aria-invalid", message ? "true" : "false");
    $("#admin-key").focus();
  }

  function signOut(message) {
    state.key = "";
    sessionStorage.removeItem(KEY_STORE);
    clearInterval(state.timer);
    state.timer = null;
    for (const d of document.querySelectorAll("dialog")) d.close();
    $("#oauth-warning").hidden = true;
    showSignin(message);
  }

  async function onSignin(ev) {
    ev.preventDefault();
    const input = $("#admin-key");
    const value = input.value.trim();
    if (!value) {
      showSignin("Enter the admin key.");
      return;
    }
    const button = $("#signin-submit");
    button.disabled = true;
    try {
      const res = await fetch(ROOT + "api/settings", {
        headers: { Authorization: "Bearer " + value },
        cache: "no-store",
      });
      if (res.status === 401 || res.status === 403) {
        const data = await res.json().catch(() => null);
        const msg = (data && data.error && data.error.message) || "Invalid admin key";
        showSignin(`That key was not accepted (${msg}). Use the gateway's FAIRGATE_ADMIN_KEY.`);
        input.select();
        return;
      }
      if (!res.ok) {
        showSignin(`The gateway answered HTTP ${res.status}; try again.`);
        return;
      }
      state.key = value;
      sessionStorage.setItem(KEY_STORE, value);
      input.value = "";
      enterApp();
    } catch (err) {
      showSignin("Cannot reach the gateway: is it running?");
    } finally {
      button.disabled = false;
    }
  }

  function enterApp() {
    $("#signin-view").hidden = true;
    $("#signin-error").textContent = "";
    $("#nav").hidden = false;
    $("#session").hidden = false;
    $("#app-view").hidden = false;
    clearInterval(state.timer);
    state.timer = setInterval(() => {
      // never behind an open dialog, and never over a plan being edited
      if (document.hidden || document.querySelector("dialog[open]") || EDITING.has(state.route)) return;
      refresh();
    }, REFRESH_MS);
    route();
  }

  // -- routing -------------------------------------------------------------------------------

  function currentRoute() {
    const m = location.hash.match(/^#\/(pools|keys|combos|plans|health|settings)\b/);
    return m ? m[1] : "pools";
  }

  function route() {
    if (!state.key) return;
    state.route = currentRoute();
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.dataset.route === state.route) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const view = $("#app-view");
    view.replaceChildren();
    const page = { pools: poolsPage, keys: keysPage, combos: combosPage, plans: plansPage, health: healthPage, settings: settingsPage }[state.route];
    document.title = `${title(state.route)} · fairgate`;
    view.append(page());
    refresh();
  }

  /* One load at a time; a refresh asked for meanwhile (another page, a save) runs right after. */
  async function refresh() {
    if (!state.key) return;
    if (state.loading) {
      state.pending = true;
      return;
    }
    state.loading = true;
    state.pending = false;
    const button = $("#refresh");
    button.disabled = true;
    button.textContent = "Refreshing…";
    try {
      const load = { pools: loadPools, plans: loadPlans, keys: loadKeys, combos: loadCombos, settings: loadSettings }[state.route] || loadHealth;
      await Promise.all([load(), loadAuthWarning()]);
      $("#updated").textContent = "Updated " + clock(Date.now());
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) pageError(err.message);
    } finally {
      state.loading = false;
      button.disabled = false;
      button.textContent = "Refresh";
    }
    if (state.pending) await refresh();
  }

  /* The banner above every page while an OAuth credential needs a human: its refresh was
   * rejected (blocked with reason auth) or its token endpoint fails. It names the connection and
   * the reason /health gives (never a token); nothing is shown while every credential is fine. */
  async function loadAuthWarning() {
    const health = await fetch(ROOT + "health", { cache: "no-store" }).then((r) => r.json()).catch(() => null);
    if (!health) return; // unreachable: the page itself says so; keep the last known banner
    const bad = (health.oauth || []).filter((a) => a.state !== "ok");
    const banner = $("#oauth-warning");
    const text = bad.map(authProblem).join("\n");
    if (banner.dataset.text === text && banner.hidden === !text) return; // no re-announcement
    banner.dataset.text = text;
    banner.hidden = !text;
    if (!text) {
      banner.replaceChildren();
      return;
    }
    banner.replaceChildren(
      h("p", {}, h("strong", {}, bad.length > 1 ? "OAuth credentials need attention" : "An OAuth credential needs attention")),
      h("ul", {}, bad.map((a) => h("li", { "data-oauth": a.connectionId }, authProblem(a)))),
      h("p", { class: "small" }, "Supply new tokens (fairgate connections login, or the admin API) to lift a block."),
    );
  }

  function authProblem(a) {
    const since = a.sinceMs ? ` since ${when(a.sinceMs)}` : "";
    const reason = a.reason || "no reason given";
    // the credential gate's action ("log in again"): requests skip the connection until then
    const act = a.action ? ` Log in again: ${a.connectionId} is skipped until then.` : "";
    if (a.state === "blocked") return `${a.connectionId}: blocked (auth)${since}: ${reason}.${act || " Until new tokens are supplied, requests routed to it fail over or fail."}`;
    const expired = a.expiresAtMs !== null && a.expiresAtMs !== undefined && a.expiresAtMs <= Date.now();
    const token = a.expiresAtMs ? (expired ? "its access token has expired" : `its access token is valid until ${when(a.expiresAtMs)}`) : "";
    return `${a.connectionId}: ${a.state}${since}: ${reason}${token ? `; ${token}` : ""}.${act}`;
  }

  function pageError(message) {
    const el = $("#page-error");
    if (el) el.textContent = message ? `Could not load this page: ${message}` : "";
  }

  /* Re-rendering replaces nodes: keep the focused control focused across it. */
  function keepFocus(fn) {
    const id = document.activeElement && document.activeElement.id;
    fn();
    if (id && document.activeElement === document.body) {
      const el = document.getElementById(id);
      if (el) el.focus();
    }
  }

  // -- pools page ----------------------------------------------------------------------------

  function poolsPage() {
    const closed = localStorage.getItem(CONCEPT_STORE) === "1";
    const concept = h(
      "details",
      { class: "card concept", open: !closed, ontoggle: (e) => localStorage.setItem(CONCEPT_STORE, e.target.open ? "0" : "1") },
      h("summary", {}, "How quota sharing works"),
      h(
        "ul",
        {},
        h("li", {}, h("strong", {}, "A pool"), " shares the quota of one or more upstream connections (their plan: requests, tokens, dollars or a percentage per window) among client keys."),
        h("li", {}, h("strong", {}, "Each key's weight"), " is its fair share of every dimension. While the pool is ", h("em", {}, "generous"), " (below the strict threshold) anyone may borrow unused quota; once it is ", h("em", {}, "strict"), ", hard keys stop at their share, soft keys are deprioritised and burst keys may go on."),
        h("li", {}, "Nobody can push the pool past its limit: a ", h("em", {}, "saturated"), " pool blocks everyone until the window frees quota. The burn rate tells you when that will happen."),
      ),
    );
    return h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("h1", {}, "Pools"),
        h("div", { class: "actions" }, newPoolButton()),
      ),
      h("p", { id: "page-error", class: "alert", role: "alert" }),
      concept,
      h("div", { id: "pools-list", class: "pools", "aria-live": "polite", "aria-busy": "true" }, h("p", { class: "muted" }, "Loading pools…")),
    );
  }

  /* "New pool" lists the connections to choose from: until they have been read once, the
   * dialog would say there are none, so the button waits for them (a click while the page is
   * still loading does nothing instead of offering an empty list). */
  function newPoolButton() {
    const ready = state.data.connections !== null;
    return h(
      "button",
      { type: "button", class: "button primary", id: "new-pool", onclick: openCreatePool, disabled: !ready, title: ready ? undefined : "Loading connections…" },
      "New pool",
    );
  }

  function setConnections(connections) {
    state.data.connections = connections;
    const button = $("#new-pool");
    if (button) {
      button.disabled = false;
      button.removeAttribute("title");
    }
  }

  async function loadPools() {
    const [pools, connections, keys, settings] = await Promise.all([
      api("GET", "/quota/pools"),
      api("GET", "/connections"),
      api("GET", "/keys"),
      api("GET", "/settings"),
    ]);
    const d = state.data;
    d.pools = pools;
    setConnections(connections);
    d.keys = keys;
    state.threshold = settings.quota.saturationThreshold;
    state.requireAllocation = !settings.access || settings.access.requireAllocation;
    d.usage = {};
    d.usageErr = {};
    d.logs = {};
    await Promise.all(
      pools.map(async (p) => {
        const id = encodeURIComponent(p.id);
        const [usage, log] = await Promise.allSettled([
          api("GET", `/quota/pools/${id}/usage`),
          api("GET", `/quota/pools/${id}/log?limit=500`),
        ]);
        if (usage.status === "fulfilled") d.usage[p.id] = usage.value;
        else d.usageErr[p.id] = usage.reason.message;
        d.logs[p.id] = log.status === "fulfilled" ? log.value.events : [];
      }),
    );
    pageError("");
    renderPools();
  }

  function renderPools() {
    const list = $("#pools-list");
    if (!list) return;
    keepFocus(() => {
      list.setAttribute("aria-busy", "false");
      const pools = state.data.pools;
      if (!pools.length) {
        list.replaceChildren(
          h(
            "div",
            { class: "card" },
            h("h2", {}, "No pools yet"),
            h("p", { class: "muted" }, "Create a pool to share a connection's quota among client keys."),
            h("button", { type: "button", class: "button primary", onclick: openCreatePool }, "Create the first pool"),
          ),
        );
        return;
      }
      list.replaceChildren(...pools.map(poolCard));
    });
  }

  function poolStatus(usage) {
    if (!usage) return "unknown";
    let status = "generous";
    for (const d of usage.dimensions) {
      if (!d.enforced) continue;
      if (d.usedFraction >= 1 || (d.limit > 0 && d.total >= d.limit)) return "saturated";
      if (d.strict) status = "strict";
    }
    return status;
  }

  const STATUS_HELP = {
    generous: "below the strict threshold: keys may borrow unused quota",
    strict: "past the strict threshold: fair shares are enforced",
    saturated: "at the limit: requests are blocked until the window frees quota",
    unknown: "usage could not be read",
  };

  function keyColors(pool) {
    const colors = {};
    pool.allocations.forEach((a, i) => (colors[a.key] = "k" + (i % PALETTE)));
    return colors;
  }

  function poolCard(pool) {
    const usage = state.data.usage[pool.id];
    const status = poolStatus(usage);
    const colors = keyColors(pool);
    const titleId = `pool-${pool.id}-title`;
    const conns = pool.connections.map((c) => h("span", { class: "chip" }, c));
    const card = h(
      "article",
      { class: "card pool", "aria-labelledby": titleId, "data-pool": pool.id },
      h(
        "div",
        { class: "pool-head" },
        h(
          "div",
          {},
          h("h2", { id: titleId }, pool.name || pool.id),
          h("p", { class: "muted small" }, `id ${pool.id} · provider ${pool.provider} · limits from ${planSourceText(pool.planSource)}${perConnectionText(pool)}`),
        ),
        h("span", { class: `badge ${status}`, "data-status": status, title: STATUS_HELP[status] }, title(status)),
      ),
      h(
        "dl",
        { class: "facts" },
        h("div", {}, h("dt", {}, "Connections"), h("dd", {}, conns)),
        h("div", {}, h("dt", {}, "Allocations"), h("dd", { "data-allocations": pool.allocations.length }, String(pool.allocations.length))),
        h("div", {}, h("dt", {}, "Sharing"), h("dd", {}, pool.shareMode === "active" ? `active keys (idle after ${duration(pool.activeWindowS * 1000)})` : "static weights")),
      ),
    );
    if (!usage) {
      card.append(h("p", { class: "alert" }, `Usage unavailable: ${state.data.usageErr[pool.id] || "unknown error"}`));
      card.append(editButton(pool));
      return card;
    }
    if (!usage.dimensions.length) {
      card.append(
        h("p", { class: "notice" }, "This pool has no dimensions: its connection's plan is empty, so nothing is enforced. Set a plan on the Plans page or give the pool its own dimensions."),
      );
    }
    card.append(legend(pool, colors, usage));
    card.append(h("div", { class: "dims" }, usage.dimensions.map((d) => dimensionBar(pool, d, colors))));
    if (usage.dimensions.length) card.append(poolDetail(pool, usage, colors));
    else card.append(editButton(pool));
    return card;
  }

  // the limits shown are the pool's whole (what it enforces); say when one came from a
  // per-connection limit (a plan's, or a percent) multiplied by the pool's connections
  function perConnectionText(pool) {
    const n = (pool.connections || []).length;
    const per = (pool.effectiveDimensions || []).filter((d) => d.basis === "per-connection");
    if (n < 2 || !per.length) return "";
    return ` · ${per.map((d) => `${d.unit}/${d.window} ${num(d.writtenLimit, d.unit)} per connection × ${n}`).join(", ")}`;
  }

  function planSourceText(source) {
    return { pool: "the pool itself", override: "a plan override", catalog: "the plan catalog", empty: "an empty plan" }[source] || source;
  }

  function editButton(pool) {
    return h(
      "button",
      { type: "button", class: "button", id: `edit-${pool.id}`, "data-edit": pool.id, onclick: () => openEditAllocations(pool) },
      "Edit allocations",
    );
  }

  function legend(pool, colors, usage) {
    const hasOther = usage.dimensions.some((d) => unattributed(d) > 0);
    return h(
      "div",
      { class: "legend", "aria-label": "Legend" },
      pool.allocations.map((a) => h("span", {}, h("span", { class: `swatch ${colors[a.key]}`, "aria-hidden": "true" }), a.key)),
      hasOther ? h("span", {}, h("span", { class: "swatch other", "aria-hidden": "true" }), "unattributed (provider reading)") : null,
      h("span", {}, h("span", { class: "swatch threshold-swatch", "aria-hidden": "true" }), `strict from ${pct(state.threshold)}`),
    );
  }

  function unattributed(d) {
    if (!d.enforced || d.limit <= 0) return 0;
    const byKeys = d.keys.reduce((s, k) => s + k.consumed, 0);
    return Math.max(0, d.usedFraction * d.limit - byKeys);
  }

  function dimensionBar(pool, d, colors) {
    const unit = UNIT_SHORT[d.unit] || d.unit;
    const name = `${d.unit} / ${d.window}`;
    const head = h(
      "div",
      { class: "dim-head" },
      h("span", { class: "dim-name" }, name),
      h(
        "span",
        { class: "dim-total", "data-total": d.total },
        d.enforced ? `${num(d.total, d.unit)} of ${num(d.limit, d.unit)} ${unit} · ${pct(d.usedFraction)}` : `${num(d.total, d.unit)} ${unit} · limit unknown (shown, not enforced)`,
      ),
      resetNote(d),
    );
    const bar = h("div", { class: "bar", role: "img", "data-dimension": d.key });
    const parts = [];
    if (d.enforced && d.limit > 0) {
      for (const k of d.keys) {
        const w = Math.min(100, (k.consumed / d.limit) * 100);
        parts.push(`${k.keyId} ${num(k.consumed, d.unit)}`);
        if (w <= 0) continue;
        bar.append(h("div", { class: `seg ${colors[k.keyId] || "other"}`, "data-key": k.keyId, title: `${k.keyId}: ${num(k.consumed, d.unit)} ${unit} (${pct(k.consumed / d.limit)} of the limit)`, style: { width: w + "%" } }));
      }
      const rest = unattributed(d);
      if (rest > 0) {
        bar.append(h("div", { class: "seg other", title: `unattributed: ${num(rest, d.unit)} ${unit}`, style: { width: Math.min(100, (rest / d.limit) * 100) + "%" } }));
        parts.push(`unattributed ${num(rest, d.unit)}`);
      }
      bar.append(h("div", { class: "threshold", "aria-hidden": "true", style: { left: state.threshold * 100 + "%" } }));
    }
    bar.setAttribute("aria-label", `${name}: ${d.enforced ? `${num(d.total, d.unit)} of ${num(d.limit, d.unit)} ${unit} used (${pct(d.usedFraction)})` : "limit unknown"}${parts.length ? ". " + parts.join(", ") : ""}`);
    return h("div", { class: "dim" }, head, bar);
  }

  /* When the dimension's counts roll over, and whose clock that is: a provider-anchored window
   * resets when the connection's own reading says, any other at the turn of fairgate's
   * epoch-aligned bucket (docs/subscriptions.md, provider-anchored windows). */
  function resetNote(d) {
    if (d.resetsAtMs === null || d.resetsAtMs === undefined) return null;
    const source = d.anchorSource ? `provider: ${d.anchorSource}` : "epoch-aligned window";
    return h("span", { class: "dim-reset muted small", "data-reset": d.key, "data-resets-at": d.resetsAtMs, "data-anchor": d.anchorSource || "" }, `resets ${when(d.resetsAtMs)} (${source})`);
  }

  /* A moment as HH:MM today, with the day when it is another day (weekly, monthly windows). */
  function when(ms) {
    const t = new Date(ms);
    const hm = t.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    if (t.toDateString() === new Date().toDateString()) return hm;
    return `${t.toLocaleDateString([], { weekday: "short", day: "numeric", month: "short" })} ${hm}`;
  }

  function chosenDimension(pool, usage) {
    const dims = usage.dimensions;
    const chosen = dims.find((d) => d.key === state.dimChoice[pool.id]);
    if (chosen) return chosen;
    // the most used enforced dimension is the one that runs out first
    return dims.slice().sort((a, b) => b.usedFraction - a.usedFraction || a.key.localeCompare(b.key))[0];
  }

  function poolDetail(pool, usage, colors) {
    const dim = chosenDimension(pool, usage);
    const selectId = `dim-${pool.id}`;
    const select = h(
      "select",
      {
        id: selectId,
        onchange: (e) => {
          state.dimChoice[pool.id] = e.target.value;
          renderPools();
        },
      },
      usage.dimensions.map((d) => h("option", { value: d.key, selected: d.key === dim.key }, `${d.unit} / ${d.window}`)),
    );
    const blocked = {};
    for (const e of state.data.logs[pool.id] || []) {
      if (e.outcome === "block") blocked[e.keyId] = (blocked[e.keyId] || 0) + 1;
    }
    return h(
      "div",
      { class: "pool-detail" },
      h(
        "div",
        { class: "detail-head" },
        h("h3", {}, "Allocations"),
        h(
          "div",
          { class: "detail-controls" },
          usage.dimensions.length > 1 ? h("div", { class: "field" }, h("label", { for: selectId }, "Dimension"), select) : null,
          editButton(pool),
        ),
      ),
      allocationTable(pool, dim, colors, blocked, usage.dimensions.length > 1),
      burnChart(pool, dim),
    );
  }

  // several dimensions: a key's standing in active mode is its dominant share, the largest
  // consumed / limit over them, shown with the dimension it is in (issue 18)
  function dominantCell(k) {
    if (!k.dominantDimension) return h("td", { class: "num dominant muted", "data-value": 0 }, "–");
    return h("td", { class: "num dominant", "data-value": k.dominantShare, "data-dimension": k.dominantDimension }, `${pct(k.dominantShare)} of ${k.dominantDimension}`);
  }

  function allocationTable(pool, d, colors, blocked, multi) {
    const unit = UNIT_SHORT[d.unit] || d.unit;
    const others = d.keys.filter((k) => k.allocated === false).map((k) => unallocatedRow(k, d, blocked, multi));
    const rows = d.keys.filter((k) => k.allocated !== false).map((k) => {
      const surplus = k.surplus;
      const atShare = Math.abs(surplus) < 0.005 * Math.max(1, k.fairShare);
      const surplusText = !d.enforced ? "–" : atShare ? "at share" : surplus > 0 ? `+${num(surplus, d.unit)} unused` : `−${num(-surplus, d.unit)} over share`;
      return h(
        "tr",
        { "data-key": k.keyId },
        h("th", { scope: "row" }, h("span", { class: "keycell" }, h("span", { class: `swatch ${colors[k.keyId] || "other"}`, "aria-hidden": "true" }), k.keyId)),
        h("td", { class: "num" }, `${nf1.format(k.weight)} %`),
        h("td", {}, k.policy),
        h("td", { class: "num consumed", "data-value": k.consumed }, num(k.consumed, d.unit)),
        h("td", { class: "num fair-share", "data-value": k.fairShare }, d.enforced ? num(k.fairShare, d.unit) : "–", k.cap !== null ? h("span", { class: "muted small" }, ` (cap ${num(k.cap, d.unit)})`) : null),
        h("td", { class: `num ${surplus >= 0 ? "surplus" : "deficit"}`, "data-value": surplus }, surplusText),
        h("td", { class: "borrowing" }, k.borrowing ? h("span", { class: "badge warn" }, "borrowing") : h("span", { class: "muted" }, "no")),
        h("td", { class: "num blocked", "data-value": blocked[k.keyId] || 0 }, String(blocked[k.keyId] || 0)),
        multi ? dominantCell(k) : null,
      );
    });
    const table = h(
      "table",
      { "data-pool-table": pool.id },
      h("caption", { class: "sr-only" }, `Allocations of ${pool.name || pool.id} on ${d.unit} / ${d.window}`),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", { scope: "col" }, "Key"),
          h("th", { scope: "col", class: "num" }, "Weight"),
          h("th", { scope: "col" }, "Policy"),
          h("th", { scope: "col", class: "num" }, `Consumed (${unit})`),
          h("th", { scope: "col", class: "num" }, "Fair share"),
          h("th", { scope: "col", class: "num" }, "Surplus / deficit"),
          h("th", { scope: "col" }, "Borrowing"),
          h("th", { scope: "col", class: "num", title: "Blocked requests among the last 500 admissions" }, "Blocked"),
          multi ? h("th", { scope: "col", class: "num", title: "The largest consumed / limit over the pool's dimensions: a key's standing in active mode" }, "Dominant share") : null,
        ),
      ),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: multi ? 9 : 8, class: "muted" }, noAllocationsText() + " Edit allocations to share this pool.")), others),
    );
    return h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": `Allocations of ${pool.name || pool.id}` }, table);
  }

  // what a key without an allocation may do depends on server.require_allocation
  function noAllocationsText() {
    return state.requireAllocation
      ? "No allocations: no key may use this pool (allocations are required)."
      : "No allocations: any key may borrow this pool's unused quota while it is generous (allocations are not required).";
  }

  // the use of keys with no allocation in the pool (only possible when allocations are not
  // required, or from before): no share, so all of it is borrowed
  function unallocatedRow(k, d, blocked, multi) {
    const unallocatedBlocked = Object.entries(blocked).filter(([id]) => !d.keys.some((x) => x.keyId === id)).reduce((s, [, n]) => s + n, 0);
    return h(
      "tr",
      { "data-key": k.keyId, class: "unallocated" },
      h("th", { scope: "row" }, h("span", { class: "keycell" }, h("span", { class: "swatch other", "aria-hidden": "true" }), "Keys without an allocation")),
      h("td", { class: "num" }, "–"),
      h("td", {}, state.requireAllocation ? "refused" : "borrow only"),
      h("td", { class: "num consumed", "data-value": k.consumed }, num(k.consumed, d.unit)),
      h("td", { class: "num fair-share", "data-value": 0 }, "none"),
      h("td", { class: "num" }, "–"),
      h("td", { class: "borrowing" }, k.borrowing ? h("span", { class: "badge warn" }, "borrowing") : h("span", { class: "muted" }, "no")),
      h("td", { class: "num blocked", "data-value": unallocatedBlocked }, String(unallocatedBlocked)),
      multi ? h("td", { class: "num dominant muted" }, "–") : null,
    );
  }

  // -- burn-rate chart -----------------------------------------------------------------------

  function burnChart(pool, d) {
    const unit = UNIT_SHORT[d.unit] || d.unit;
    const samples = d.burnSamples || [];
    const points = [];
    for (let i = 1; i < samples.length; i++) {
      const dt = (samples[i].tMs - samples[i - 1].tMs) / 1000;
      if (dt <= 0) continue;
      points.push([samples[i].tMs, (Math.max(0, samples[i].value - samples[i - 1].value) / dt) * 60]);
    }
    const ema = d.burnRatePerS * 60;
    const titleId = nextId("burn-title");
    const section = h("section", { class: "burn", "aria-labelledby": titleId }, h("h3", { id: titleId }, `Burn rate · ${d.unit} / ${d.window}`));
    // the gateway reports no rate before its samples span a minute (quota/burn.py MIN_SPAN_MS)
    const sampled = samples.length ? samples[samples.length - 1].tMs - samples[0].tMs : 0;
    let forecast;
    if (!d.enforced) forecast = "limit unknown: no forecast";
    else if (sampled < 60000) forecast = "collecting samples: a forecast needs a minute of them";
    else if (d.timeToExhaustionMs === null) forecast = ema > 0 ? "no forecast" : "not running out at the current rate";
    else if (d.timeToExhaustionMs <= 0) forecast = "the pool is exhausted now";
    else forecast = `at this rate the pool runs out in ${duration(d.timeToExhaustionMs)} (around ${clock(Date.now() + d.timeToExhaustionMs)})`;
    const caption = h("p", { class: "burn-caption", "data-ttl": d.timeToExhaustionMs === null ? "" : d.timeToExhaustionMs }, h("strong", {}, `${num(ema, d.unit)} ${unit}/min`), " (over the window) · ", forecast);
    if (!points.length) {
      section.append(h("p", { class: "muted" }, "No burn-rate data yet: the chart needs two samples of the pool's consumption, taken as traffic is settled and on refresh."), caption);
      return section;
    }
    // draw at the size it is shown (1 SVG unit = 1 CSS pixel), so text stays readable on phones
    const list = $("#pools-list");
    const W = Math.max(300, Math.min(1100, (list ? list.clientWidth : 700) - 40)), H = 180, L = 52, R = 14, T = 12, B = 26;
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    const span = Math.max(1, t1 - t0);
    const yMax = niceMax(Math.max(ema, ...points.map((p) => p[1])));
    const x = (t) => (points.length === 1 ? L + (W - L - R) / 2 : L + ((t - t0) / span) * (W - L - R));
    const y = (v) => T + (1 - v / yMax) * (H - T - B);
    const descId = nextId("burn-desc");
    const chart = svg(
      "svg",
      { class: "chart", viewBox: `0 0 ${W} ${H}`, width: W, role: "img", "aria-labelledby": `${titleId} ${descId}`, "data-points": points.length },
      svg("desc", { id: descId }, `Consumption rate in ${unit} per minute over the last ${duration(span)}; latest ${num(points[points.length - 1][1], d.unit)}, rate over the window ${num(ema, d.unit)}.`),
    );
    for (const v of [0, yMax / 2, yMax]) {
      chart.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      chart.append(svg("text", { class: "axis-label", x: L - 6, y: y(v) + 4, "text-anchor": "end" }, num(v, d.unit)));
    }
    chart.append(svg("text", { class: "axis-label", x: L, y: H - 6 }, span < 60000 && points.length > 1 ? `${nf1.format(span / 1000)} s earlier` : clock(t0)));
    if (points.length > 1) chart.append(svg("text", { class: "axis-label", x: W - R, y: H - 6, "text-anchor": "end" }, clock(t1)));
    chart.append(svg("text", { class: "axis-label", x: W - R, y: T + 10, "text-anchor": "end" }, `${unit}/min`));
    const coords = points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
    if (points.length > 1) {
      chart.append(svg("polygon", { class: "area", points: `${x(t0).toFixed(1)},${y(0)} ${coords.join(" ")} ${x(t1).toFixed(1)},${y(0)}` }));
      chart.append(svg("polyline", { class: "line", points: coords.join(" ") }));
    }
    for (const p of points) chart.append(svg("circle", { class: "dot", cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 3 }, svg("title", {}, `${clock(p[0])}: ${num(p[1], d.unit)} ${unit}/min`)));
    chart.append(svg("line", { class: "ema", x1: L, x2: W - R, y1: y(ema), y2: y(ema) }));
    const key = h(
      "p",
      { class: "chart-legend small muted", "aria-hidden": "true" },
      h("span", {}, h("span", { class: "line-swatch" }), "rate between samples"),
      h("span", {}, h("span", { class: "line-swatch ema-swatch" }), "rate over the window"),
    );
    section.append(chart, key, caption);
    return section;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (v * 1.1 <= m * p) return m * p;
    return 10 * p;
  }

  // -- dialogs -------------------------------------------------------------------------------

  /* A modal <dialog>: focus moves in, Escape closes it (the browser's cancel), focus returns. */
  function openDialog(heading, build, submitLabel, onSubmit) {
    const opener = document.activeElement;
    const titleId = nextId("dialog-title");
    const formError = h("p", { class: "alert", role: "alert" });
    const submit = h("button", { type: "submit", class: "button primary" }, submitLabel);
    const dlg = h("dialog", { class: "dialog", "aria-labelledby": titleId });
    const close = () => dlg.close();
    const form = h(
      "form",
      { novalidate: true },
      h("div", { class: "dialog-head" }, h("h2", { id: titleId }, heading), h("button", { type: "button", class: "button ghost small", "aria-label": "Close", onclick: close }, "✕")),
      h("div", { class: "dialog-body" }, build(), formError),
      h("div", { class: "dialog-foot" }, h("button", { type: "button", class: "button", onclick: close }, "Cancel"), submit),
    );
    form.addEventListener("input", (ev) => clearFieldError(ev.target));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      formError.textContent = "";
      submit.disabled = true;
      try {
        await onSubmit({ form, formError, close });
      } finally {
        submit.disabled = false;
      }
    });
    dlg.append(form);
    dlg.addEventListener("close", () => {
      dlg.remove();
      if (opener && document.contains(opener)) opener.focus();
      else if (opener && opener.id && document.getElementById(opener.id)) document.getElementById(opener.id).focus();
    });
    document.body.append(dlg);
    dlg.showModal();
    const first = form.querySelector(".dialog-body input:not([disabled]), .dialog-body select:not([disabled])");
    if (first) first.focus();
    return dlg;
  }

  /* A labelled control with its help text and its error slot, tied by aria-describedby. */
  function field(label, control, path, help, hidden) {
    control.id = control.id || nextId("f");
    if (path) control.dataset.field = path;
    const errId = control.id + "-error";
    const helpId = help ? control.id + "-help" : null;
    control.setAttribute("aria-describedby", [helpId, errId].filter(Boolean).join(" "));
    return h(
      "div",
      { class: "field" },
      h("label", { for: control.id }, label, hidden ? h("span", { class: "sr-only" }, ` ${hidden}`) : null),
      control,
      help ? h("p", { class: "help", id: helpId }, help) : null,
      h("p", { class: "field-error", id: errId, "data-error-for": path || "" }),
    );
  }

  function input(attrs) {
    return h("input", { type: "text", autocomplete: "off", ...attrs });
  }

  function select(options, value, attrs) {
    return h(
      "select",
      attrs || {},
      options.map((o) => {
        const [v, text] = Array.isArray(o) ? o : [o, o];
        return h("option", { value: v, selected: v === value }, text);
      }),
    );
  }

  /* Typing in a field answers its message: clear it (fields with a live check manage theirs). */
  function clearFieldError(control) {
    if (!control || !control.id || control.dataset.liveCheck) return;
    if (control.getAttribute("aria-invalid") !== "true") return;
    control.removeAttribute("aria-invalid");
    const slot = document.getElementById(control.id + "-error");
    if (slot) slot.textContent = "";
  }

  function clearErrors(form) {
    for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
    for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  }

  /* Show a message next to the control of `path` ("allocations.0.weight"), or the closest
   * enclosing one ("allocations.0" → the row's key, "connections.1" → the connections group). */
  function setFieldError(form, path, message) {
    let p = path;
    while (p) {
      const control = form.querySelector(`[data-field="${CSS.escape(p)}"]`);
      if (control) {
        control.setAttribute("aria-invalid", "true");
        const slot = document.getElementById(control.id + "-error");
        if (slot) slot.textContent = slot.textContent ? `${slot.textContent} ${message}` : message;
        return true;
      }
      const alt = form.querySelector(`[data-field-prefix="${CSS.escape(p)}"]`);
      if (alt) {
        const slot = document.getElementById(alt.id + "-error");
        if (slot) slot.textContent = message;
        alt.setAttribute("aria-invalid", "true");
        return true;
      }
      p = p.includes(".") ? p.slice(0, p.lastIndexOf(".")) : "";
    }
    return false;
  }

  function showErrors(form, formError, errors, summary) {
    clearErrors(form);
    const loose = [];
    for (const [path, message] of errors) if (!setFieldError(form, path, message)) loose.push(path ? `${path}: ${message}` : message);
    formError.textContent = loose.length ? loose.join(" · ") : summary || "";
    const bad = form.querySelector('[aria-invalid="true"]');
    if (bad) bad.focus();
  }

  /* Reports an API failure in the dialog: 422 field errors next to their fields. */
  function showApiError(form, formError, err) {
    if (err.status === 401) return;
    if (err.fields && err.fields.length) {
      showErrors(form, formError, err.fields.map((f) => [f.field, f.message]), "");
      if (!formError.textContent) formError.textContent = "The gateway refused the change: see the messages next to the fields.";
    } else {
      clearErrors(form);
      formError.textContent = err.message;
    }
  }

  /* The last step of a dialog that sends its change: `send()` calls the API; once the gateway
     took it the dialog closes, `done(answer)` tells the user and the page refreshes. A refusal
     keeps the dialog open with its 422 fields next to their inputs. */
  async function sendChange({ form, formError, close }, send, done) {
    let answer;
    try {
      answer = await send();
    } catch (err) {
      showApiError(form, formError, err);
      return;
    }
    close();
    done(answer);
    await refresh();
  }

  // -- editable rows: allocations and dimensions ----------------------------------------------

  function rowsEditor(opts) {
    // opts: {kind, items, makeRow(item, i) -> {el, read()}, newItem(), addLabel, emptyText, onChange}
    const container = h("div", { class: "rows", "data-field-prefix": opts.prefix, id: nextId("rows") });
    const errSlot = h("p", { class: "field-error", id: container.id + "-error" });
    let rows = [];
    const render = (items) => {
      rows = items.map((item, i) => opts.makeRow(item, i, (idx) => remove(idx)));
      container.replaceChildren(...(rows.length ? rows.map((r) => r.el) : [h("p", { class: "rows-empty" }, opts.emptyText)]));
      if (opts.onChange) opts.onChange();
    };
    const remove = (idx) => {
      const items = rows.map((r) => r.read());
      items.splice(idx, 1);
      render(items);
      const next = container.querySelector("select, input") || addButton;
      next.focus();
    };
    const addButton = h(
      "button",
      {
        type: "button",
        class: "button small",
        onclick: () => {
          const items = rows.map((r) => r.read());
          items.push(opts.newItem(items));
          render(items);
          const last = rows[rows.length - 1];
          if (last) last.el.querySelector("select, input").focus();
        },
      },
      opts.addLabel,
    );
    render(opts.items);
    return { el: h("div", {}, container, errSlot, addButton), read: () => rows.map((r) => r.read()) };
  }

  function allocationEditor(allocs, withCaps, onChange) {
    const keyIds = state.data.keys.map((k) => k.id);
    const total = h("p", { class: "total-line", "aria-live": "polite" });
    let editor;
    const updateTotal = () => {
      if (!editor) return;
      const sum = editor.read().reduce((s, a) => s + (Number.isFinite(a.weight) ? a.weight : 0), 0);
      total.textContent = `Total weight: ${nf1.format(sum)} %` + (sum > 100 ? " — over 100 %: fair shares then add up to more than the pool, and the pool's limit decides." : sum === 0 && editor.read().length ? " — all 0: every key gets an equal share." : "");
      total.classList.toggle("warn", sum > 100);
      if (onChange) onChange();
    };
    editor = rowsEditor({
      prefix: "allocations",
      items: allocs,
      addLabel: "Add allocation",
      emptyText: "No allocations yet. " + noAllocationsText(),
      onChange: () => updateTotal(),
      newItem: (items) => {
        const used = new Set(items.map((a) => a.key));
        return { key: keyIds.find((k) => !used.has(k)) || "", weight: "", policy: "hard", capValue: null, capUnit: null, modelCaps: [] };
      },
      makeRow: (a, i, remove) => {
        const keySel = select([["", "Choose a key"], ...keyIds.map((k) => [k, k])], a.key, { "data-role": "key" });
        if (a.key && !keyIds.includes(a.key)) keySel.append(h("option", { value: a.key, selected: true }, `${a.key} (deleted)`));
        const weight = input({ type: "number", inputmode: "decimal", min: "0", max: "100", step: "any", value: a.weight === "" || a.weight === undefined ? "" : String(a.weight), "data-role": "weight" });
        const policy = select(POLICIES, a.policy || "hard", { "data-role": "policy" });
        const cells = [
          field("Key", keySel, `allocations.${i}.key`, null, `(row ${i + 1})`),
          field("Weight %", weight, `allocations.${i}.weight`),
          field("Policy", policy, `allocations.${i}.policy`),
        ];
        let capValue = null, capUnit = null;
        if (withCaps) {
          capValue = input({ type: "number", inputmode: "decimal", min: "0", step: "any", value: a.capValue === null || a.capValue === undefined ? "" : String(a.capValue), "data-role": "capValue" });
          capUnit = select([["", "no cap"], ...UNITS.map((u) => [u, u])], a.capUnit || "", { "data-role": "capUnit" });
          cells.push(field("Cap", capValue, `allocations.${i}.capValue`), field("Cap unit", capUnit, `allocations.${i}.capUnit`));
        }
        const el = h(
          "div",
          { class: `row alloc${withCaps ? " with-caps" : ""}`, "data-row": i, role: "group", "aria-label": `Allocation ${i + 1}` },
          cells,
          h("div", { class: "row-actions" }, h("button", { type: "button", class: "button small danger", "aria-label": `Remove allocation ${i + 1}${a.key ? " (" + a.key + ")" : ""}`, onclick: () => remove(i) }, "Remove")),
        );
        // check a weight as soon as the user leaves it (the message appears next to it), and
        // while a message is shown, re-check on every keystroke so it goes away as soon as the
        // value is right (not on blur: the layout would shift under the pointer mid-click)
        const checkWeight = (always) => {
          const slot = document.getElementById(weight.id + "-error");
          if (!always && !slot.textContent) return;
          const msg = weightProblem(weight.value);
          slot.textContent = msg || "";
          if (msg) weight.setAttribute("aria-invalid", "true");
          else weight.removeAttribute("aria-invalid");
        };
        weight.dataset.liveCheck = "1";
        weight.addEventListener("input", () => {
          updateTotal();
          checkWeight(false);
        });
        weight.addEventListener("change", () => checkWeight(true));
        return {
          el,
          read: () => ({
            key: keySel.value,
            weight: weight.value.trim() === "" ? "" : Number(weight.value),
            weightRaw: weight.value,
            policy: policy.value,
            capValue: capValue && capValue.value.trim() !== "" ? Number(capValue.value) : null,
            capUnit: capUnit && capUnit.value ? capUnit.value : null,
            modelCaps: a.modelCaps || [],
          }),
        };
      },
    });
    updateTotal();
    return { el: h("div", {}, editor.el, total), read: editor.read };
  }

  function weightProblem(raw) {
    if (String(raw).trim() === "") return "Enter a weight between 0 and 100 (percent of the pool).";
    const w = Number(raw);
    if (!Number.isFinite(w) || w < 0 || w > 100) return "Weight must be between 0 and 100 (percent of the pool).";
    return null;
  }

  function checkAllocations(allocs, withCaps) {
    const errors = [];
    const seen = new Set();
    allocs.forEach((a, i) => {
      if (!a.key) errors.push([`allocations.${i}.key`, "Choose a key."]);
      else if (seen.has(a.key)) errors.push([`allocations.${i}.key`, `Key ${a.key} already has an allocation in this pool.`]);
      seen.add(a.key);
      const wp = weightProblem(a.weightRaw);
      if (wp) errors.push([`allocations.${i}.weight`, wp]);
      if (withCaps) {
        if (a.capValue !== null && !(a.capValue > 0)) errors.push([`allocations.${i}.capValue`, "A cap must be greater than 0."]);
        if ((a.capValue === null) !== (a.capUnit === null)) errors.push([a.capValue === null ? `allocations.${i}.capValue` : `allocations.${i}.capUnit`, "Give the cap and its unit together."]);
      }
    });
    return errors;
  }

  function allocationBody(a) {
    return { key: a.key, weight: a.weight, policy: a.policy, capValue: a.capValue, capUnit: a.capUnit, modelCaps: a.modelCaps };
  }

  function dimensionEditor(dims, emptyText, prefix) {
    return rowsEditor({
      prefix,
      items: dims,
      addLabel: "Add dimension",
      emptyText,
      newItem: (items) => {
        const used = new Set(items.map((d) => `${d.unit}/${d.window}`));
        for (const u of UNITS) for (const w of WINDOWS) if (!used.has(`${u}/${w}`)) return { unit: u, window: w, limit: "" };
        return { unit: "requests", window: "hourly", limit: "" };
      },
      makeRow: (d, i, remove) => {
        const unit = select(UNITS, d.unit, { "data-role": "unit" });
        const win = select(WINDOWS, d.window, { "data-role": "window" });
        const limit = input({ type: "number", inputmode: "decimal", min: "0", step: "any", value: d.limit === "" || d.limit === undefined ? "" : String(d.limit), "data-role": "limit" });
        const el = h(
          "div",
          { class: "row dimension", "data-row": i, role: "group", "aria-label": `Dimension ${i + 1}` },
          field("Unit", unit, `${prefix}.${i}.unit`, null, `(row ${i + 1})`),
          field("Window", win, `${prefix}.${i}.window`),
          field("Limit", limit, `${prefix}.${i}.limit`),
          h("div", { class: "row-actions" }, h("button", { type: "button", class: "button small danger", "aria-label": `Remove dimension ${i + 1} (${d.unit} / ${d.window})`, onclick: () => remove(i) }, "Remove")),
        );
        // windowAnchor is not edited here: an existing dimension keeps its own (undefined = the default)
        return { el, read: () => ({ unit: unit.value, window: win.value, limit: limit.value.trim() === "" ? "" : Number(limit.value), limitRaw: limit.value, windowAnchor: d.windowAnchor }) };
      },
    });
  }

  function checkDimensions(dims, prefix) {
    const errors = [];
    const seen = new Set();
    dims.forEach((d, i) => {
      const k = `${d.unit}/${d.window}`;
      if (seen.has(k)) errors.push([`${prefix}.${i}.window`, `${d.unit} / ${d.window} is already listed.`]);
      seen.add(k);
      if (String(d.limitRaw).trim() === "" || !Number.isFinite(d.limit) || d.limit < 0) errors.push([`${prefix}.${i}.limit`, "Enter a limit of 0 or more (0 = unknown: shown, not enforced)."]);
    });
    return errors;
  }

  // -- create pool -----------------------------------------------------------------------------

  function openCreatePool() {
    const d = state.data;
    const id = input({ required: true, maxlength: "64", spellcheck: "false" });
    const name = input({ maxlength: "200" });
    const shareMode = select([["static", "static: weights are fixed shares"], ["active", "active: idle keys hold no share"]], "static");
    const boxes = d.connections.map((c) => {
      const box = h("input", { type: "checkbox", value: c.id, disabled: !!c.pool || !c.enabled, "data-provider": c.provider });
      const note = c.pool ? ` — in pool ${c.pool}` : !c.enabled ? " — disabled" : "";
      return h("label", { class: "check" }, box, `${c.id} (${c.provider})`, h("span", { class: "muted small" }, note));
    });
    const group = h(
      "fieldset",
      { id: nextId("conns"), "data-field": "connections" },
      h("legend", {}, "Connections"),
      h("p", { class: "help" }, "The upstream accounts whose quota the pool shares (one provider; a connection belongs to one pool)."),
      boxes.length ? boxes : h("p", { class: "muted" }, "No connections yet: add one through the admin API first."),
    );
    const groupErr = h("p", { class: "field-error", id: group.id + "-error" });
    let dims, allocs;
    openDialog(
      "New pool",
      () => {
        dims = dimensionEditor([], "None: the pool enforces its first connection's plan (catalog or override, see Plans), once per connection. A limit set here is the whole pool's, as written (a percent limit: each connection's).", "dimensions");
        allocs = allocationEditor([], false);
        return h(
          "div",
          {},
          h("div", { class: "grid-2" }, field("Pool id", id, "id", "Letters, digits, '.', '_' or '-'; used in URLs."), field("Name", name, "name", "Optional; shown on the dashboard.")),
          group,
          groupErr,
          field("Sharing", shareMode, "shareMode"),
          h("fieldset", {}, h("legend", {}, "Dimensions (optional)"), dims.el),
          h("fieldset", {}, h("legend", {}, "Allocations"), allocs.el),
        );
      },
      "Create pool",
      async ({ form, formError, close }) => {
        const chosen = [...group.querySelectorAll("input:checked")].map((b) => b.value);
        const providers = new Set([...group.querySelectorAll("input:checked")].map((b) => b.dataset.provider));
        const errors = [];
        const idValue = id.value.trim();
        if (!idValue) errors.push(["id", "Enter a pool id."]);
        else if (!ID_RE.test(idValue)) errors.push(["id", "Use 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit."]);
        else if (d.pools.some((p) => p.id === idValue)) errors.push(["id", `A pool with the id ${idValue} already exists.`]);
        if (!chosen.length) errors.push(["connections", "Choose at least one connection."]);
        else if (providers.size > 1) errors.push(["connections", "The connections of a pool must share one provider."]);
        const dimItems = dims.read();
        const allocItems = allocs.read();
        errors.push(...checkDimensions(dimItems, "dimensions"), ...checkAllocations(allocItems, false));
        if (errors.length) {
          showErrors(form, formError, errors, "");
          return;
        }
        clearErrors(form);
        await sendChange(
          { form, formError, close },
          () =>
            api("POST", "/quota/pools", {
              id: idValue,
              name: name.value.trim(),
              connections: chosen,
              shareMode: shareMode.value,
              dimensions: dimItems.map((x) => ({ unit: x.unit, window: x.window, limit: x.limit, windowAnchor: x.windowAnchor })),
              allocations: allocItems.map(allocationBody),
            }),
          () => toast(`Pool ${idValue} created.`),
        );
      },
    );
  }

  // -- edit allocations ------------------------------------------------------------------------

  function openEditAllocations(pool) {
    let editor;
    openDialog(
      `Allocations of ${pool.name || pool.id}`,
      () => {
        editor = allocationEditor(
          pool.allocations.map((a) => ({ ...a })),
          true,
        );
        return h(
          "div",
          {},
          h("p", { class: "muted" }, "Weights are percent of the pool (its fair share of every dimension). Policies apply once the pool is strict: hard keys stop at their share, soft keys are deprioritised, burst keys go on. A cap is an absolute limit in its unit."),
          editor.el,
        );
      },
      "Save allocations",
      async ({ form, formError, close }) => {
        const items = editor.read();
        const errors = checkAllocations(items, true);
        if (errors.length) {
          showErrors(form, formError, errors, "");
          return;
        }
        clearErrors(form);
        await sendChange(
          { form, formError, close },
          () => api("PATCH", `/quota/pools/${encodeURIComponent(pool.id)}`, { allocations: items.map(allocationBody) }),
          () => toast(`Allocations of ${pool.id} saved.`),
        );
      },
    );
  }

  // -- plans page ------------------------------------------------------------------------------

  function plansPage() {
    const sel = h("select", { id: "plan-connection", onchange: (e) => { state.planConn = e.target.value; showPlan(); } });
    return h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Plans")),
      h("p", { class: "muted" }, "A plan is the quota of one connection: its dimensions (unit × window × limit). A manual override wins over the built-in catalog; without either the plan is empty and nothing is enforced. A pool without its own dimensions enforces the plan of its first connection, times its number of connections."),
      h("p", { id: "page-error", class: "alert", role: "alert" }),
      h(
        "div",
        { class: "plan-grid" },
        h("div", { class: "card" }, field("Connection", sel, null, "Choose the upstream account whose plan to see or change."), h("dl", { class: "kv", id: "plan-conn-facts" })),
        h("div", { class: "card", id: "plan-view", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading plans…")),
      ),
    );
  }

  async function loadPlans() {
    const [connections, plans] = await Promise.all([api("GET", "/connections"), api("GET", "/quota/plans")]);
    setConnections(connections);
    state.data.plans = plans;
    pageError("");
    const sel = $("#plan-connection");
    if (!sel) return;
    if (!connections.some((c) => c.id === state.planConn)) state.planConn = connections.length ? connections[0].id : null;
    keepFocus(() => {
      sel.replaceChildren(...connections.map((c) => h("option", { value: c.id, selected: c.id === state.planConn }, `${c.id} (${c.provider})`)));
    });
    showPlan();
  }

  const SOURCE_HELP = {
    override: "A manual plan set here. It wins over the catalog; revert to use the catalog again.",
    catalog: "The built-in plan of this provider. Saving creates an override for this connection only.",
    empty: "No plan is known for this provider: nothing is enforced until you set one.",
  };

  function showPlan(message) {
    const view = $("#plan-view");
    const facts = $("#plan-conn-facts");
    if (!view) return;
    const conn = state.data.connections.find((c) => c.id === state.planConn);
    const plan = (state.data.plans || []).find((p) => p.connectionId === state.planConn);
    if (!conn || !plan) {
      view.replaceChildren(h("p", { class: "muted" }, "No connections yet."));
      return;
    }
    facts.replaceChildren(
      h("dt", {}, "Provider"), h("dd", {}, conn.provider),
      h("dt", {}, "Pool"), h("dd", {}, conn.pool || "none"),
      h("dt", {}, "Models"), h("dd", {}, conn.models.length ? conn.models.join(", ") : "any"),
      h("dt", {}, "Enabled"), h("dd", {}, conn.enabled ? "yes" : "no"),
    );
    const status = h("p", { class: "notice", role: "status", id: "plan-status" }, message || "");
    const formError = h("p", { class: "alert", role: "alert" });
    const editor = dimensionEditor(
      plan.dimensions.map((d) => ({ unit: d.unit, window: d.window, limit: d.limit, windowAnchor: d.windowAnchor })),
      "No dimensions: add one to give this connection a plan.",
      "dimensions",
    );
    const revert = h("button", { type: "button", class: "button danger", id: "plan-revert", disabled: plan.source !== "override" }, "Revert to catalog");
    const save = h("button", { type: "submit", class: "button primary", id: "plan-save" }, "Save plan");
    const form = h(
      "form",
      { novalidate: true, "aria-labelledby": "plan-title" },
      h(
        "div",
        { class: "plan-meta" },
        h("h2", { id: "plan-title" }, `Plan of ${conn.id}`),
        h("span", { class: `badge ${plan.source}`, id: "plan-source", "data-source": plan.source }, plan.source),
      ),
      h("p", { class: "muted" }, SOURCE_HELP[plan.source]),
      status,
      plan.dimensions.length
        ? h(
            "div",
            { class: "table-wrap", role: "region", tabindex: "0", "aria-label": "Resolved plan" },
            h(
              "table",
              { id: "plan-table" },
              h("caption", { class: "sr-only" }, `Resolved plan of ${conn.id}`),
              h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Unit"), h("th", { scope: "col" }, "Window"), h("th", { scope: "col", class: "num" }, "Limit"), h("th", { scope: "col" }, "Enforced"))),
              h("tbody", {}, plan.dimensions.map((d) => h("tr", { "data-dimension": d.key }, h("td", {}, d.unit), h("td", {}, d.window), h("td", { class: "num" }, d.enforced ? num(d.limit, d.unit) : "unknown"), h("td", {}, d.enforced ? "yes" : "no (limit unknown)")))),
            ),
          )
        : null,
      h("h3", { class: "section" }, "Edit dimensions"),
      editor.el,
      formError,
      h("div", { class: "form-actions" }, revert, save),
    );
    form.addEventListener("input", (ev) => clearFieldError(ev.target));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const items = editor.read();
      const errors = checkDimensions(items, "dimensions");
      if (!items.length) errors.push(["dimensions", "Add at least one dimension (or revert to the catalog)."]);
      if (errors.length) {
        showErrors(form, formError, errors, "");
        return;
      }
      clearErrors(form);
      formError.textContent = "";
      save.disabled = true;
      try {
        const out = await api("PUT", `/quota/plans/${encodeURIComponent(conn.id)}`, { dimensions: items.map((x) => ({ unit: x.unit, window: x.window, limit: x.limit, windowAnchor: x.windowAnchor })) });
        replacePlan(out);
        showPlan(`Saved: ${conn.id} now uses an override plan.`);
        $("#plan-save") && $("#plan-save").focus();
      } catch (err) {
        showApiError(form, formError, err);
      } finally {
        save.disabled = false;
      }
    });
    revert.addEventListener("click", async () => {
      formError.textContent = "";
      revert.disabled = true;
      try {
        const path = `/quota/plans/${encodeURIComponent(conn.id)}`;
        await api("DELETE", path);  // 204, as every delete: the plan now in force is a GET
        const out = await api("GET", path);
        replacePlan(out);
        showPlan(out.source === "catalog" ? `Reverted: ${conn.id} uses the catalog plan again.` : `Reverted: there is no catalog plan for ${conn.provider}, so the plan is empty.`);
        $("#plan-connection") && $("#plan-connection").focus();
      } catch (err) {
        formError.textContent = err.message;
        revert.disabled = false;
      }
    });
    view.replaceChildren(form);
  }

  function replacePlan(out) {
    const plans = state.data.plans || [];
    const i = plans.findIndex((p) => p.connectionId === out.connectionId);
    if (i >= 0) plans[i] = out;
    else plans.push(out);
  }

  // -- health page -----------------------------------------------------------------------------

  function healthPage() {
    return h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Health")),
      h("p", { id: "page-error", class: "alert", role: "alert" }),
      h("div", { id: "health-cards", class: "health-grid", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…")),
      h("section", { class: "card", "aria-labelledby": "resilience-title" }, h("h2", { id: "resilience-title" }, "Breakers, cooldowns and lockouts"), h("div", { id: "resilience" }, h("p", { class: "muted" }, "Loading…"))),
    );
  }

  async function loadHealth() {
    const [healthRes, settings, monitoring] = await Promise.all([
      fetch(ROOT + "health", { cache: "no-store" }).then((r) => r.json()).catch(() => null),
      api("GET", "/settings"),
      api("GET", "/monitoring/health").catch((err) => {
        if (err.status === 404) return null;
        throw err;
      }),
    ]);
    pageError("");
    const health = healthRes || {};
    const store = settings.quotaStore;
    const reachable = health.store ? health.store.reachable : null;
    const kv = (pairs) => h("dl", { class: "kv" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    const cards = [
      h(
        "section",
        { class: "card", "aria-labelledby": "store-title", id: "store-card" },
        h("h2", { id: "store-title" }, "Quota store"),
        h("span", { class: `badge ${reachable === null ? "unknown" : reachable ? "ok" : "bad"}`, id: "store-status" }, reachable === null ? "unknown" : reachable ? "reachable" : "unreachable"),
        kv([
          ["Active driver", h("span", { id: "store-driver" }, store.activeDriver)],
          ["Requested", store.requestedDriver + ` (from ${store.driverSource})`],
          ["Redis URL", store.redisUrlConfigured ? `configured (${store.redisUrlSource})` : "not configured"],
          ["Fallback", store.fallbackReason || "none"],
        ]),
      ),
      h(
        "section",
        { class: "card", "aria-labelledby": "failopen-title" },
        h("h2", { id: "failopen-title" }, "Fail-open admissions"),
        h("p", { class: "big", id: "fail-open" }, health.failOpen === undefined ? "–" : String(health.failOpen)),
        h("p", { class: "muted small" }, "Requests allowed because the quota engine or store failed, since the gateway started."),
      ),
      h(
        "section",
        { class: "card", "aria-labelledby": "gw-title" },
        h("h2", { id: "gw-title" }, "Gateway"),
        kv([
          ["Status", health.status || "unknown"],
          ["In flight", health.inflight === undefined ? "–" : String(health.inflight)],
          ["Strict from", pct(settings.quota.saturationThreshold)],
          ["Soft factor", nf2.format(settings.quota.softDeprioritizeFactor)],
        ]),
      ),
    ];
    keepFocus(() => $("#health-cards").replaceChildren(...cards));
    const res = $("#resilience");
    if (monitoring === null) {
      res.replaceChildren(h("p", { class: "notice", id: "monitoring-unavailable" }, "Not available: this gateway has no /api/monitoring/health endpoint."));
      return;
    }
    // the quota store is in the cards above; everything else as the endpoint reports it
    const rest = Object.fromEntries(Object.entries(monitoring).filter(([k]) => k !== "quotaStore"));
    const only = Object.values(rest);
    // one wrapping object ({"resilience": {...}}): show its contents, the card has the title
    const root = only.length === 1 && only[0] && typeof only[0] === "object" && !Array.isArray(only[0]) ? only[0] : rest;
    const sections = renderSections(root, 3);
    res.replaceChildren(...(sections.length ? sections : [h("p", { class: "muted" }, "Nothing to report.")]));
    const errors = monitoring.quotaStore && monitoring.quotaStore.storeErrors;
    if (errors !== undefined) $("#store-card dl").append(h("dt", {}, "Store errors"), h("dd", { id: "store-errors" }, String(errors)));
    // outage state: the circuit (down → admissions fail open) and the journal awaiting replay
    const outage = monitoring.quotaStore && monitoring.quotaStore.outage;
    if (outage) {
      const j = outage.journal || {};
      $("#store-card dl").append(
        h("dt", {}, "Outage"),
        h("dd", { id: "store-outage" }, outage.down ? "down: failing open, journaling usage" : "none"),
        h("dt", {}, "Journal"),
        h("dd", { id: "store-journal" }, `${j.pending ?? 0} pending, ${j.replayed ?? 0} replayed, ${j.dropped ?? 0} dropped`),
        h("dt", {}, "Last error"),
        h("dd", { id: "store-last-error" }, outage.lastError || "none"),
      );
    }
  }

  /* Render whatever the monitoring endpoint returns, whatever its depth: scalars as a definition
   * list, lists of objects and objects of objects (breakers by provider) as tables, other objects
   * as nested sections. Times and durations in milliseconds are shown as such. */
  function renderSections(obj, level, skip) {
    const out = [];
    const scalars = [];
    const tag = "h" + Math.min(level || 3, 6);
    for (const [k, v] of Object.entries(obj || {})) {
      if ((skip || []).includes(k)) continue;
      if (v === null || typeof v !== "object") {
        scalars.push([h("dt", {}, colTitle(k)), h("dd", {}, cell(k, v))]);
        continue;
      }
      const head = h(tag, { class: "section" }, title(k));
      let rows = null;
      if (Array.isArray(v)) rows = v.map((x) => (x !== null && typeof x === "object" && !Array.isArray(x) ? x : { value: x }));
      else if (Object.keys(v).length && Object.values(v).every((x) => x !== null && typeof x === "object" && !Array.isArray(x))) rows = Object.entries(v).map(([name, x]) => ({ name, ...x }));
      if (rows === null) {
        const inner = renderSections(v, (level || 3) + 1);
        out.push(h("section", { "data-section": k }, head, inner.length ? inner : h("p", { class: "muted" }, "None.")));
        continue;
      }
      if (!rows.length) {
        out.push(h("section", { "data-section": k }, head, h("p", { class: "muted" }, "None.")));
        continue;
      }
      const cols = [...new Set(rows.flatMap((r) => Object.keys(r)))];
      out.push(
        h(
          "section",
          { "data-section": k },
          head,
          h(
            "div",
            { class: "table-wrap", role: "region", tabindex: "0", "aria-label": title(k) },
            h("table", {}, h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, colTitle(c))))), h("tbody", {}, rows.map((r) => h("tr", {}, cols.map((c) => h("td", {}, cell(c, r[c]))))))),
          ),
        ),
      );
    }
    if (scalars.length) out.unshift(h("dl", { class: "kv" }, scalars));
    return out;
  }

  function scalar(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") return nf2.format(v);
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  /* "remaining_ms" → "Remaining": the cell says the unit. */
  const colTitle = (k) => title(String(k).replace(/(_ms|Ms)$/, "")) || title(k);

  const STATE_BADGE = { open: "bad", half_open: "warn", closed: "ok", ok: "ok", true: "ok", false: "bad" };

  function cell(key, v) {
    if (key === "state" && typeof v === "string") return h("span", { class: `badge ${STATE_BADGE[v] || "unknown"}` }, v.replace("_", " "));
    // an upstream's own text (a permanent block's): a tenant's request may have written it, so it
    // stays closed behind a click, as text, beside the classified cause (issue 43, N16)
    if (key === "detail" && typeof v === "string") return v ? h("details", { class: "raw-detail" }, h("summary", {}, "Upstream text"), h("pre", {}, v)) : "–";
    if (typeof v === "number" && /(^|_)ms$|[a-z]Ms$/.test(key)) {
      if (v > 1e12) return new Date(v).toLocaleString();
      return v < 60000 ? `${nf1.format(v / 1000)} s` : duration(v);
    }
    return scalar(v);
  }

  // -- keys page -------------------------------------------------------------------------------

  function keysPage() {
    return h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("h1", {}, "Keys"),
        h("div", { class: "actions" }, h("button", { type: "button", class: "button primary", id: "new-key", onclick: openCreateKey }, "New key")),
      ),
      h("p", { id: "page-error", class: "alert", role: "alert" }),
      h("div", { id: "secret-reveal" }),
      h("section", { class: "card" }, h("div", { id: "keys-list", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading keys…"))),
    );
  }

  const modelsText = (models) => (models && models.length ? models.join(", ") : "any model");
  const modelsList = (text) => String(text || "").split(",").map((m) => m.trim()).filter(Boolean);
  const ago = (ms) => (ms ? `${duration(Date.now() - ms)} ago` : "not since the gateway started");

  async function loadKeys() {
    const keys = await api("GET", "/keys");
    pageError("");
    state.data.keys = keys;
    const list = $("#keys-list");
    if (!list) return;
    if (!keys.length) {
      list.replaceChildren(h("p", { class: "muted" }, "No client keys yet: create one with New key."));
      return;
    }
    const row = (k) =>
      h(
        "tr",
        { "data-key": k.id },
        h("th", { scope: "row" }, h("span", { class: "key-name" }, k.name), h("span", { class: "muted small block" }, k.id)),
        h("td", {}, h("span", { class: `badge ${k.enabled ? "ok" : "bad"}` }, k.enabled ? "enabled" : "disabled")),
        h("td", { class: "key-models" }, modelsText(k.allowedModels)),
        h("td", { class: "key-upstreams" }, [...(k.allowedProviders || []), ...(k.allowedConnections || [])].join(", ") || "pools only"),
        h("td", { class: "key-last-used" }, ago(k.lastUsedMs)),
        h(
          "td",
          { class: "row-actions" },
          h("button", { type: "button", class: "button small", onclick: () => openEditKey(k), "aria-label": `Edit ${k.id}` }, "Edit"),
          h("button", { type: "button", class: "button small", onclick: () => openRotateKey(k), "aria-label": `Rotate ${k.id}` }, "Rotate"),
          h("button", { type: "button", class: "button small danger", onclick: () => openRevokeKey(k), "aria-label": `Revoke ${k.id}` }, "Revoke"),
        ),
      );
    keepFocus(() =>
      list.replaceChildren(
        h(
          "div",
          { class: "table-wrap", role: "region", tabindex: "0", "aria-label": "Client keys" },
          h(
            "table",
            { id: "keys-table" },
            h("thead", {}, h("tr", {}, ["Key", "Status", "Allowed models", "Unpooled upstreams", "Last used", "Actions"].map((c) => h("th", { scope: "col" }, c)))),
            h("tbody", {}, keys.map(row)),
          ),
        ),
      ),
    );
  }

  /* The one time a secret exists outside the client: show it with a copy button and say so. */
  function revealSecret(created, verb) {
    const code = h("code", { id: "new-secret", class: "secret" }, created.secret);
    const copy = h(
      "button",
      {
        type: "button",
        class: "button small",
        onclick: async () => {
          try {
            await navigator.clipboard.writeText(created.secret);
            toast("Copied.");
          } catch (err) {
            toast("Copy failed: select the secret and copy it by hand.");
          }
        },
      },
      "Copy",
    );
    const box = h(
      "section",
      { class: "card reveal", role: "status", "aria-labelledby": "reveal-title" },
      h("h2", { id: "reveal-title" }, `Key ${created.id} ${verb}`),
      h("p", {}, "Store this secret now: it is shown once and cannot be recovered."),
      h("div", { class: "secret-row" }, code, copy),
      h("button", { type: "button", class: "button ghost small", id: "reveal-done", onclick: () => box.remove() }, "I have stored it"),
    );
    $("#secret-reveal").replaceChildren(box);
    $("#reveal-done").focus();
  }

  function keyFields(k) {
    const name = input({ name: "name", value: k ? k.name : "", maxlength: 128 });
    const models = input({ name: "allowedModels", value: k ? k.allowedModels.join(", ") : "", placeholder: "gpt-4o-mini, claude-sonnet-4" });
    const providers = input({ name: "allowedProviders", value: k ? (k.allowedProviders || []).join(", ") : "", placeholder: "openai, anthropic" });
    const connections = input({ name: "allowedConnections", value: k ? (k.allowedConnections || []).join(", ") : "", placeholder: "openai-1" });
    return { name, models, providers, connections };
  }

  /* The fields every key dialog shares, and the body they make. */
  function keyFieldList(f) {
    const pooled = "Pooled connections need an allocation in their pool instead.";
    return [
      field("Name", f.name, "name", "Who or what uses it."),
      field("Allowed models", f.models, "allowedModels", "Comma-separated; empty: any model."),
      field("Allowed providers", f.providers, "allowedProviders", `Comma-separated: their connections outside every pool. ${pooled}`),
      field("Allowed connections", f.connections, "allowedConnections", `Comma-separated connection ids outside every pool. ${pooled}`),
    ];
  }

  function keyBody(f) {
    return {
      name: f.name.value.trim(),
      allowedModels: modelsList(f.models.value),
      allowedProviders: modelsList(f.providers.value),
      allowedConnections: modelsList(f.connections.value),
    };
  }

  function openCreateKey() {
    const id = input({ name: "id", placeholder: "generated when empty", pattern: ID_RE.source, maxlength: 64 });
    const f = keyFields(null);
    openDialog(
      "New client key",
      () => [field("Key id", id, "id", "Letters, digits, '.', '_' or '-'; empty: key-<8 hex>."), ...keyFieldList(f)],
      "Create key",
      async ({ form, formError, close }) => {
        const body = keyBody(f);
        if (id.value.trim()) body.id = id.value.trim();
        if (body.id && !ID_RE.test(body.id)) {
          showErrors(form, formError, [["id", "Use letters, digits, '.', '_' or '-' (up to 64)."]], "");
          return;
        }
        await sendChange(
          { form, formError, close },
          () => api("POST", "/keys", body),
          (created) => revealSecret(created, "created"),
        );
      },
    );
  }

  function openEditKey(k) {
    const f = keyFields(k);
    openDialog(
      `Edit ${k.id}`,
      () => keyFieldList(f),
      "Save",
      (dialog) =>
        sendChange(
          dialog,
          () => api("PATCH", `/keys/${encodeURIComponent(k.id)}`, keyBody(f)),
          () => toast(`Saved ${k.id}.`),
        ),
    );
  }

  function openRotateKey(k) {
    openDialog(
      `Rotate ${k.id}?`,
      () => h("p", {}, "A new secret replaces the current one, which stops working at once. The key keeps its id, models and pool shares."),
      "Rotate",
      (dialog) =>
        sendChange(
          dialog,
          () => api("POST", `/keys/${encodeURIComponent(k.id)}/rotate`),
          (created) => revealSecret(created, "rotated"),
        ),
    );
  }

  function openRevokeKey(k) {
    openDialog(
      `Revoke ${k.id}?`,
      () => h("p", {}, "The key stops working at once and its allocations in every pool go with it. This cannot be undone."),
      "Revoke",
      (dialog) =>
        sendChange(
          dialog,
          () => api("DELETE", `/keys/${encodeURIComponent(k.id)}`),
          () => toast(`Revoked ${k.id}.`),
        ),
    );
  }

  // -- combos page -----------------------------------------------------------------------------

  function combosPage() {
    return h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Combos")),
      h("p", { id: "page-error", class: "alert", role: "alert" }),
      h("p", { class: "muted small" }, "Per target over the last 15 minutes of this gateway process: success rate, latency of the recent successful answers, and what resilience says about it now."),
      h("div", { id: "combos-list", class: "pools", "aria-live": "polite" }, h("p", { class: "muted" }, "Loading combos…")),
    );
  }

  const STATE_CLASS = { ok: "ok", cooldown: "warn", lockout: "warn", "breaker-half-open": "warn", "breaker-open": "bad" };

  async function loadCombos() {
    const combos = await api("GET", "/combos");
    const stats = await Promise.all(combos.map((c) => api("GET", `/combos/${encodeURI(c.name)}/stats`).catch(() => null)));
    pageError("");
    const list = $("#combos-list");
    if (!list) return;
    if (!combos.length) {
      list.replaceChildren(h("p", { class: "muted" }, "No combos: define them in the config file's combos section or with POST /api/combos."));
      return;
    }
    const ms = (v) => (v === null || v === undefined ? "–" : `${nf1.format(v)} ms`);
    const cards = combos.map((c, i) => {
      const st = stats[i] || { targets: [], fallbacks: {}, windowMinutes: 15 };
      const rows = st.targets.map((t) =>
        h(
          "tr",
          { "data-target": t.key },
          h("th", { scope: "row" }, t.key),
          h("td", {}, nf2.format(t.weight)),
          h("td", { class: "t-requests" }, String(t.requests)),
          h("td", { class: "t-success" }, t.successRate === null ? "–" : pct(t.successRate)),
          h("td", { class: "t-p50" }, ms(t.p50Ms)),
          h("td", { class: "t-p95" }, ms(t.p95Ms)),
          h("td", { class: "t-state" }, h("span", { class: `badge ${STATE_CLASS[t.state] || "unknown"}` }, t.state), t.blockedUntilMs ? h("span", { class: "muted small block" }, `until ${clock(t.blockedUntilMs)}`) : null),
        ),
      );
      const fallbacks = Object.entries(st.fallbacks || {}).sort((a, b) => b[1] - a[1]);
      return h(
        "article",
        { class: "card combo", "data-combo": c.name, "aria-labelledby": `combo-${i}` },
        h("div", { class: "pool-head" }, h("h2", { id: `combo-${i}` }, c.name), h("span", { class: "badge unknown strategy" }, c.strategy)),
        h(
          "div",
          { class: "table-wrap", role: "region", tabindex: "0", "aria-label": `Targets of ${c.name}` },
          h(
            "table",
            {},
            h("thead", {}, h("tr", {}, ["Target", "Weight", "Requests", "Success", "p50", "p95", "State"].map((x) => h("th", { scope: "col" }, x)))),
            h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No connection serves these targets."))),
          ),
        ),
        h("h3", { class: "section" }, `Fallbacks (last ${st.windowMinutes} minutes)`),
        fallbacks.length
          ? h("ul", { class: "fallbacks" }, fallbacks.map(([reason, n]) => h("li", {}, h("strong", {}, String(n)), ` × ${reason}`)))
          : h("p", { class: "muted small fallbacks-none" }, "None."),
      );
    });
    keepFocus(() => list.replaceChildren(...cards));
  }

  // -- settings page ---------------------------------------------------------------------------

  function settingsPage() {
    return h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Settings")),
      h("p", { id: "page-error", class: "alert", role: "alert" }),
      h("section", { class: "card", "aria-labelledby": "qs-title" }, h("h2", { id: "qs-title" }, "Quota store"), h("div", { id: "quota-store" }, h("p", { class: "muted" }, "Loading…"))),
      h("section", { class: "card", "aria-labelledby": "aliases-title" }, h("h2", { id: "aliases-title" }, "Model aliases"), h("div", { id: "model-aliases" }, h("p", { class: "muted" }, "Loading…"))),
    );
  }

  // One alias a line, "pattern -> target": what Claude Code and Codex ask for by default
  // (claude-*, gpt-*) sent to a model the gateway serves.
  function aliasLines(aliases) {
    return aliases.map((a) => `${a.pattern} -> ${a.target}`).join("\n");
  }

  function parseAliasLines(text) {
    return text
      .split("\n")
      .map((line) => line.trim())
      .filter(Boolean)
      .map((line) => {
        const [pattern, target] = line.split("->").map((x) => (x || "").trim());
        return { pattern, target };
      });
  }

  async function loadAliases() {
    const box = $("#model-aliases");
    if (!box) return;
    const data = await api("GET", "/model-aliases");
    const text = h("textarea", { name: "aliases", rows: 5, spellcheck: "false", id: nextId("aliases") });
    text.value = aliasLines(data.aliases);
    const source = h("p", { class: "muted", id: "aliases-source" }, data.source === "db" ? "Set here (wins over the config file)." : "From the config file (model_aliases).");
    const formError = h("p", { class: "alert", role: "alert" });
    const save = h("button", { type: "submit", class: "button primary", id: "aliases-save" }, "Save aliases");
    const reset = h("button", { type: "button", class: "button", id: "aliases-reset" }, "Use the config file's");
    const form = h(
      "form",
      { novalidate: true, id: "aliases-form" },
      field("Aliases", text, "aliases", "One a line: pattern -> target. * matches any characters (claude-* -> claude-sonnet-4). Exact names first, then patterns in this order; a model a connection lists is never aliased."),
      formError,
      h("div", { class: "form-actions" }, save, reset),
    );
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      formError.textContent = "";
      save.disabled = true;
      try {
        const out = await api("PUT", "/model-aliases", { aliases: parseAliasLines(text.value) });
        text.value = aliasLines(out.aliases);
        source.textContent = "Set here (wins over the config file).";
        toast("Model aliases applied.");
      } catch (err) {
        showApiError(form, formError, err);
      } finally {
        save.disabled = false;
      }
    });
    reset.addEventListener("click", async () => {
      formError.textContent = "";
      try {
        await api("DELETE", "/model-aliases");
        toast("The config file's model aliases apply again.");
        await loadAliases();
      } catch (err) {
        showApiError(form, formError, err);
      }
    });
    keepFocus(() => box.replaceChildren(source, form));
  }

  function storeFacts(qs) {
    return h(
      "dl",
      { class: "kv", id: "store-facts" },
      h("dt", {}, "Active driver"),
      h("dd", {}, h("span", { id: "active-driver", class: `badge ${qs.activeDriver === qs.requestedDriver ? "ok" : "warn"}` }, qs.activeDriver)),
      h("dt", {}, "Requested"),
      h("dd", { id: "requested-driver" }, `${qs.requestedDriver} (from ${qs.driverSource})`),
      h("dt", {}, "Redis URL"),
      h("dd", { id: "redis-url-state" }, qs.redisUrlConfigured ? `configured (${qs.redisUrlSource}); never shown` : "not configured"),
      h("dt", {}, "Fallback"),
      h("dd", { id: "fallback-reason" }, qs.fallbackReason || "none"),
    );
  }

  async function loadSettings() {
    const settings = await api("GET", "/settings");
    pageError("");
    const box = $("#quota-store");
    if (!box) return;
    const qs = settings.quotaStore;
    const driver = select([["sqlite", "SQLite (one host)"], ["redis", "Redis (shared by replicas)"]], qs.requestedDriver, { name: "driver" });
    const url = input({ type: "password", name: "redisUrl", placeholder: qs.redisUrlConfigured ? "•••••• (kept when empty)" : "redis://host:6379/0", autocomplete: "off", spellcheck: "false" });
    const clearUrl = h("input", { type: "checkbox", name: "clearUrl", id: nextId("clear-url") });
    const formError = h("p", { class: "alert", role: "alert" });
    const save = h("button", { type: "submit", class: "button primary", id: "store-save" }, "Apply");
    const facts = storeFacts(qs);
    const form = h(
      "form",
      { novalidate: true, id: "store-form" },
      field("Driver", driver, "quotaStore.driver", "Redis lets several gateway replicas share one set of counters; an unreachable Redis falls back to SQLite and says why."),
      field("Redis URL", url, "quotaStore.redisUrl", "Write-only: it may hold a password, so it is never shown again."),
      h("label", { class: "check", for: clearUrl.id }, clearUrl, "Forget the stored Redis URL (the environment's applies)"),
      formError,
      h("div", { class: "form-actions" }, save),
    );
    form.addEventListener("input", (ev) => clearFieldError(ev.target));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      formError.textContent = "";
      const body = { driver: driver.value };
      if (clearUrl.checked) body.redisUrl = null;
      else if (url.value.trim()) body.redisUrl = url.value.trim();
      save.disabled = true;
      try {
        const out = await api("PUT", "/settings", { quotaStore: body });
        url.value = "";
        clearUrl.checked = false;
        $("#store-facts").replaceWith(storeFacts(out.quotaStore));
        const q = out.quotaStore;
        toast(q.fallbackReason ? `Applied: running on ${q.activeDriver} (${q.fallbackReason}).` : `Applied: running on ${q.activeDriver}.`);
      } catch (err) {
        showApiError(form, formError, err);
      } finally {
        save.disabled = false;
      }
    });
    keepFocus(() => box.replaceChildren(facts, form));
    await loadAliases();
  }

  // -- boot ------------------------------------------------------------------------------------

  function boot() {
    $("#signin-form").addEventListener("submit", onSignin);
    $("#signout").addEventListener("click", () => signOut(""));
    $("#refresh").addEventListener("click", () => refresh());
    window.addEventListener("hashchange", () => {
      route();
      $("#main").focus();
    });
    if (state.key) enterApp();
    else showSignin("");
  }

  window.fairgate = { refresh, state }; // for operators poking around in the console, and tests
  boot();
})();
