// gpumem report: draws the charts of the page from the JSON in #report-data, on canvases.
// No library: line charts of min/max buckets (every peak survives any zoom), segment maps
// and a stacked bar. Publishes in #render-status how many charts it drew, how many errors it
// saw and where the charts are, for the tests that render the page in a headless browser.
(function () {
  "use strict";
  var started = performance.now();
  var status = { charts: 0, errors: 0, rects: [], ms: 0 };
  function publish() {
    var el = document.getElementById("render-status");
    if (!el) return;
    el.setAttribute("data-charts", String(status.charts));
    el.setAttribute("data-errors", String(status.errors));
    el.setAttribute("data-rects", JSON.stringify(status.rects));
    el.setAttribute("data-draw-ms", String(status.ms));
    el.setAttribute("data-done", "true");
    el.textContent = status.charts + " charts drawn in " + status.ms + " ms, " + status.errors + " script errors";
  }
  window.addEventListener("error", function () { status.errors++; publish(); });
  var consoleError = console.error;
  console.error = function () {
    status.errors++;
    publish();
    consoleError.apply(console, arguments);
  };

  var COLORS = { torch: "#d1495b", expandable: "#edae49", gpumem: "#00798c", none: "#8d8d8d" };
  var EXTRA = ["#6a4c93", "#30638e", "#8ac926", "#ff595e"];
  var LIVE = "#2f2f2f";
  var RANGE_COLORS = { live: "#3a6ea5", cached: "#9fd3a5", hole: "#d9d9d9" };
  function colorOf(name, i) { return COLORS[name] || EXTRA[i % EXTRA.length]; }

  function fmtBytes(b) {
    if (b <= 1024) return Math.round(b) + " B";
    if (b <= 1048576) return (b / 1024).toFixed(2) + " KiB";
    if (b <= 1073741824) return (b / 1048576).toFixed(2) + " MiB";
    return (b / 1073741824).toFixed(2) + " GiB";
  }
  function fmtShortBytes(b) {
    if (b === 0) return "0";
    if (b < 1048576) return +(b / 1024).toFixed(1) + " KiB";
    if (b < 1073741824) return +(b / 1048576).toFixed(1) + " MiB";
    return +(b / 1073741824).toFixed(2) + " GiB";
  }
  function fmtPercent(v) { return (100 * v).toFixed(1) + " %"; }
  function fmtCount(n) { return Math.round(n).toLocaleString("en-US"); }

  var BYTE_UNITS = [[1073741824, " GiB"], [1048576, " MiB"], [1024, " KiB"], [1, " B"]];
  // About `count` ticks over [lo, hi] ("bytes" or "count"): the unit is picked first (bytes:
  // the largest binary unit `hi` reaches), then a step of 1, 2 or 5 x 10^k in that unit, at
  // least one byte or event, and labels with the decimals the step needs, so that distinct
  // ticks never share a label. Returns [{v, label}].
  function ticks(lo, hi, count, kind) {
    var unit = 1, name = "";
    if (kind === "bytes") {
      for (var u = 0; u < BYTE_UNITS.length; u++) {
        unit = BYTE_UNITS[u][0];
        name = BYTE_UNITS[u][1];
        if (hi >= unit) break;
      }
    }
    var raw = (hi - lo) / unit / Math.max(1, count);
    var p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-12))));
    var m = raw / p;
    var step = Math.max((m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p, 1 / unit);
    var decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
    var out = [];
    for (var k = Math.ceil(lo / unit / step - 1e-9); k * step * unit <= hi * (1 + 1e-12); k++) {
      var v = k * step;
      var label = v === 0 ? "0" : kind === "bytes" ? v.toFixed(decimals) + name : fmtCount(v);
      out.push({ v: v * unit, label: label });
    }
    return out;
  }

  var tip = null;
  function showTip(html, pageX, pageY) {
    if (!tip) {
      tip = document.createElement("div");
      tip.className = "tip";
      document.body.appendChild(tip);
    }
    tip.innerHTML = html;
    tip.style.display = "block";
    var x = pageX + 14;
    if (x + tip.offsetWidth > window.scrollX + document.documentElement.clientWidth - 8) {
      x = pageX - tip.offsetWidth - 14;
    }
    tip.style.left = x + "px";
    tip.style.top = pageY + 12 + "px";
  }
  function hideTip() { if (tip) tip.style.display = "none"; }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  function prepare(canvas, height) {
    var dpr = window.devicePixelRatio || 1;
    var width = canvas.clientWidth || canvas.parentNode.clientWidth || 600;
    canvas.style.height = height + "px";
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx: ctx, w: width, h: height };
  }

  var drawn = [];
  function record(canvas, kind, chart) {
    if (chart && chart.draw) drawn.push(chart);
    var r = canvas.getBoundingClientRect();
    status.rects.push({
      chart: kind,
      x: Math.round(r.left + window.scrollX), y: Math.round(r.top + window.scrollY),
      w: Math.round(r.width), h: Math.round(r.height),
      ticks: chart && chart.labels
    });
    status.charts++;
  }

  // The lowest and highest value of `s` over events [i0, i1), or null when none.
  function range(s, i0, i1) {
    var b0 = Math.max(0, Math.floor(i0 / s.step));
    var b1 = Math.min(s.hi.length - 1, Math.floor((Math.max(i1, i0 + 1) - 1) / s.step));
    if (b1 < b0) return null;
    var lo = s.lo[b0], hi = s.hi[b0];
    for (var b = b0 + 1; b <= b1; b++) {
      if (s.lo[b] < lo) lo = s.lo[b];
      if (s.hi[b] > hi) hi = s.hi[b];
    }
    return [lo, hi];
  }

  // A zoom group: charts over the same events zoom and pan together.
  function Group(len) {
    this.len = Math.max(1, len);
    this.x0 = 0;
    this.x1 = this.len;
    this.charts = [];
  }
  Group.prototype.set = function (x0, x1) {
    var minSpan = Math.min(this.len, 20);
    if (x1 - x0 < minSpan) { var c = (x0 + x1) / 2; x0 = c - minSpan / 2; x1 = c + minSpan / 2; }
    if (x0 < 0) { x1 -= x0; x0 = 0; }
    if (x1 > this.len) { x0 -= x1 - this.len; x1 = this.len; }
    this.x0 = Math.max(0, x0);
    this.x1 = Math.min(this.len, x1);
    this.charts.forEach(function (c) { c.draw(); });
  };

  // A line chart of bucketed series over events: options.series [{label, color, dash, data,
  // width}], options.marks [{x, label}] (steps), options.hlines [{y, label, color}],
  // options.points [{x, label, color}] (out-of-memory), options.percent, options.yMax.
  function LineChart(canvas, group, options) {
    this.canvas = canvas;
    this.group = group;
    this.o = options;
    this.hover = null;
    this.drag = null;
    this.m = { l: 74, r: 28, t: 20, b: 26 };
    group.charts.push(this);
    this.draw();
    this.listen();
  }
  LineChart.prototype.xOf = function (i) {
    var g = this.group, m = this.m;
    return m.l + (i - g.x0) / (g.x1 - g.x0) * (this.w - m.l - m.r);
  };
  LineChart.prototype.iOf = function (px) {
    var g = this.group, m = this.m;
    return g.x0 + (px - m.l) / (this.w - m.l - m.r) * (g.x1 - g.x0);
  };
  LineChart.prototype.draw = function () {
    var o = this.o, g = this.group, m = this.m;
    var p = prepare(this.canvas, o.height || 300);
    var ctx = p.ctx;
    this.w = p.w;
    this.h = p.h;
    var plotW = Math.max(10, p.w - m.l - m.r), plotH = p.h - m.t - m.b;
    var cols = Math.floor(plotW);
    var perCol = (g.x1 - g.x0) / cols;
    // Column values of every series, and the y range they need.
    var yMax = o.yMax || 0;
    var columns = o.series.map(function (s) {
      var out = new Array(cols);
      for (var c = 0; c < cols; c++) {
        var v = range(s.data, Math.floor(g.x0 + c * perCol), Math.ceil(g.x0 + (c + 1) * perCol));
        out[c] = v;
        if (!o.yMax && v && v[1] > yMax) yMax = v[1];
      }
      return out;
    });
    if (!o.yMax) {
      (o.hlines || []).concat(o.points || []).forEach(function (l) { if (l.y > yMax) yMax = l.y; });
      yMax = yMax * 1.08 || 1;
    }
    this.yMax = yMax;
    var yOf = function (v) { return m.t + plotH - v / yMax * plotH; };
    ctx.clearRect(0, 0, p.w, p.h);
    ctx.font = "11px system-ui, sans-serif";
    // Grid and y labels.
    var yTicks = o.percent ? [0, 1, 2, 3, 4, 5].map(function (k) {
      return { v: k / 5, label: k * 20 + " %" };
    }) : ticks(0, yMax, 5, "bytes");
    ctx.strokeStyle = "#e6e6e6";
    ctx.fillStyle = "#555";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    ctx.lineWidth = 1;
    yTicks.forEach(function (t) {
      var py = Math.round(yOf(t.v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(m.l, py); ctx.lineTo(m.l + plotW, py); ctx.stroke();
      ctx.fillText(t.label, m.l - 6, py);
    });
    // X labels: event indices.
    var xTicks = o.hideX ? [] : ticks(g.x0, g.x1, Math.max(2, Math.floor(plotW / 110)), "count");
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    var self = this;
    xTicks.forEach(function (t) { ctx.fillText(t.label, self.xOf(t.v), m.t + plotH + 6); });
    this.labels = { x: xTicks.map(function (t) { return t.label; }), y: yTicks.map(function (t) { return t.label; }) };
    ctx.save();
    ctx.beginPath();
    ctx.rect(m.l, m.t - 2, plotW, plotH + 4);
    ctx.clip();
    // Steps.
    var lastLabel = -1e9;
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    for (var k = 0; k < (o.marks || []).length; k++) {
      var mark = o.marks[k];
      if (mark.x < g.x0 || mark.x > g.x1) continue;
      var mx = Math.round(this.xOf(mark.x)) + 0.5;
      ctx.strokeStyle = "#c9c9c9";
      ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(mx, m.t); ctx.lineTo(mx, m.t + plotH); ctx.stroke();
      ctx.setLineDash([]);
      if (mx - lastLabel > 52) {
        ctx.fillStyle = "#888";
        ctx.fillText(mark.label, mx + 3, m.t + 1);
        lastLabel = mx;
      }
    }
    // Horizontal lines (capacity).
    (o.hlines || []).forEach(function (l) {
      var ly = Math.round(yOf(l.y)) + 0.5;
      ctx.strokeStyle = l.color;
      ctx.setLineDash([6, 4]);
      ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.moveTo(m.l, ly); ctx.lineTo(m.l + plotW, ly); ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = l.color;
      ctx.textAlign = "right";
      ctx.textBaseline = "bottom";
      ctx.fillText(l.label, m.l + plotW - 4, ly - 2);
    });
    // Series: per column a vertical stroke from its lowest to its highest value, joined.
    o.series.forEach(function (s, si) {
      var col = columns[si];
      ctx.strokeStyle = s.color;
      ctx.lineWidth = s.width || 1.5;
      ctx.setLineDash(s.dash || []);
      ctx.beginPath();
      var started = false;
      for (var c = 0; c < cols; c++) {
        var v = col[c];
        if (!v) continue;
        var px = m.l + c + 0.5;
        if (!started) { ctx.moveTo(px, yOf(v[1])); started = true; } else ctx.lineTo(px, yOf(v[1]));
        if (v[0] !== v[1]) { ctx.lineTo(px, yOf(v[0])); ctx.lineTo(px, yOf(v[1])); }
      }
      ctx.stroke();
      ctx.setLineDash([]);
    });
    // Out-of-memory points.
    (o.points || []).forEach(function (pt) {
      if (pt.x < g.x0 || pt.x > g.x1) return;
      var px = self.xOf(pt.x), py = yOf(pt.y);
      ctx.strokeStyle = pt.color;
      ctx.lineWidth = 2.5;
      ctx.beginPath();
      ctx.moveTo(px - 6, py - 6); ctx.lineTo(px + 6, py + 6);
      ctx.moveTo(px + 6, py - 6); ctx.lineTo(px - 6, py + 6);
      ctx.stroke();
    });
    // Hover line and drag selection.
    if (this.hover !== null) {
      ctx.strokeStyle = "#333";
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(Math.round(this.hover) + 0.5, m.t);
      ctx.lineTo(Math.round(this.hover) + 0.5, m.t + plotH);
      ctx.stroke();
    }
    if (this.drag && this.drag.now !== null) {
      ctx.fillStyle = "rgba(40, 90, 160, 0.15)";
      var a = Math.min(this.drag.from, this.drag.now), b = Math.max(this.drag.from, this.drag.now);
      ctx.fillRect(a, m.t, b - a, plotH);
    }
    ctx.restore();
    ctx.strokeStyle = "#999";
    ctx.lineWidth = 1;
    ctx.strokeRect(m.l + 0.5, m.t + 0.5, plotW, plotH);
  };
  LineChart.prototype.tipAt = function (px) {
    var o = this.o, g = this.group;
    var perCol = (g.x1 - g.x0) / Math.max(1, Math.floor(this.w - this.m.l - this.m.r));
    var i0 = Math.floor(this.iOf(px)), i1 = Math.max(i0 + 1, Math.ceil(this.iOf(px) + perCol));
    var head = i1 - i0 > 1 ? "events " + fmtCount(i0) + "–" + fmtCount(i1 - 1) : "event " + fmtCount(i0);
    var stepLabel = "";
    (o.marks || []).forEach(function (mk) { if (mk.x <= i0) stepLabel = mk.label; });
    if (o.hideX) head = "";
    var lines = ["<b>" + head + (head && stepLabel ? " · " : "") + escapeHtml(stepLabel) + "</b>"];
    o.series.forEach(function (s) {
      var v = range(s.data, i0, i1);
      if (!v) return;
      var f = o.percent ? fmtPercent : fmtBytes;
      var lo = f(v[0]), hi = f(v[1]);
      var text = lo === hi ? hi : lo + " – " + hi;
      lines.push('<span class="sw" style="background:' + s.color + '"></span>' +
        escapeHtml(s.label) + ": " + text);
    });
    return lines.join("<br>");
  };
  LineChart.prototype.listen = function () {
    var self = this, c = this.canvas, m = this.m;
    function localX(e) { return e.clientX - c.getBoundingClientRect().left; }
    function inside(x) { return x >= m.l && x <= self.w - m.r; }
    c.addEventListener("mousedown", function (e) {
      var x = localX(e);
      if (inside(x)) self.drag = { from: x, now: null };
    });
    c.addEventListener("mousemove", function (e) {
      var x = localX(e);
      if (self.drag) { self.drag.now = Math.max(m.l, Math.min(self.w - m.r, x)); }
      self.hover = inside(x) ? x : null;
      self.draw();
      if (self.hover !== null) showTip(self.tipAt(x), e.pageX, e.pageY); else hideTip();
    });
    c.addEventListener("mouseleave", function () {
      self.hover = null; self.drag = null; self.draw(); hideTip();
    });
    window.addEventListener("mouseup", function () {
      var d = self.drag;
      self.drag = null;
      if (d && d.now !== null && Math.abs(d.now - d.from) > 4) {
        var a = self.iOf(Math.min(d.from, d.now)), b = self.iOf(Math.max(d.from, d.now));
        self.group.set(a, b);
      } else self.draw();
    });
    c.addEventListener("dblclick", function () { self.group.set(0, self.group.len); });
    c.addEventListener("wheel", function (e) {
      var x = localX(e);
      if (!inside(x)) return;
      e.preventDefault();
      var g = self.group, at = self.iOf(x), f = e.deltaY < 0 ? 0.8 : 1.25;
      g.set(at - (at - g.x0) * f, at + (g.x1 - at) * f);
    }, { passive: false });
  };

  // The segment map: every segment's ranges laid end to end in address order, wrapped into
  // rows; live blocks, cached blocks and holes in their colours, segment starts as dark ticks.
  function SegmentMap(canvas, map) {
    var flat = [], total = 0;
    map.segments.forEach(function (s, si) {
      s.ranges.forEach(function (r) {
        flat.push({ at: total + r[0], size: r[1], state: r[2], seg: si, off: r[0] });
      });
      total += s.size;
    });
    this.canvas = canvas;
    this.map = map;
    this.flat = flat;
    this.total = Math.max(1, total);
    this.rows = Math.max(4, Math.min(14, Math.ceil(Math.sqrt(map.segment_count)) + 3));
    this.rowH = 20;
    this.draw();
    var self = this;
    canvas.addEventListener("mousemove", function (e) {
      var r = canvas.getBoundingClientRect();
      var hit = self.at(e.clientX - r.left, e.clientY - r.top);
      if (!hit) { hideTip(); return; }
      var seg = map.segments[hit.seg];
      var what = seg.count > 1 ? seg.count + " segments from 0x" : "segment 0x";
      showTip("<b>" + hit.state + "</b> " + fmtBytes(hit.size) + "<br>" + what +
        seg.address.toString(16) + " (" + fmtBytes(seg.size) + (seg.expandable ? ", expandable" : "") +
        ")<br>offset " + fmtBytes(hit.off), e.pageX, e.pageY);
    });
    canvas.addEventListener("mouseleave", hideTip);
  }
  SegmentMap.prototype.draw = function () {
    var p = prepare(this.canvas, this.rows * this.rowH);
    var ctx = p.ctx, w = p.w, rowBytes = this.total / this.rows, rowH = this.rowH;
    this.w = w;
    ctx.clearRect(0, 0, w, p.h);
    var self = this;
    function span(start, end, fill) {
      var last = self.rows - 1;
      while (start < end) {
        // The row holding `start`, exact despite rounding in start / rowBytes.
        var row = Math.min(last, Math.floor(start / rowBytes));
        while (row < last && (row + 1) * rowBytes <= start) row++;
        while (row > 0 && row * rowBytes > start) row--;
        var rowEnd = row === last ? end : Math.min(end, (row + 1) * rowBytes);
        var x0 = (start - row * rowBytes) / rowBytes * w, x1 = (rowEnd - row * rowBytes) / rowBytes * w;
        fill(x0, row * rowH + 1, Math.max(x1 - x0, 0.6), rowH - 2);
        start = rowEnd;
      }
    }
    this.flat.forEach(function (r) {
      ctx.fillStyle = RANGE_COLORS[r.state];
      span(r.at, r.at + r.size, function (x, y, width, height) { ctx.fillRect(x, y, width, height); });
    });
    // Segment starts, where a segment is wide enough to see.
    var at = 0;
    ctx.fillStyle = "#1d1d1d";
    this.map.segments.forEach(function (s) {
      if (s.size / rowBytes * w >= 3) span(at, at + 1, function (x, y) { ctx.fillRect(x, y, 1.5, rowH - 2); });
      at += s.size;
    });
  };
  SegmentMap.prototype.at = function (x, y) {
    var row = Math.floor(y / this.rowH);
    if (row < 0 || row >= this.rows) return null;
    var byte = (row + x / this.w) * (this.total / this.rows);
    var lo = 0, hi = this.flat.length - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (this.flat[mid].at <= byte) lo = mid; else hi = mid - 1;
    }
    var r = this.flat[lo];
    return r && byte < r.at + r.size ? r : null;
  };

  // A horizontal stacked bar: parts [{label, value, color}].
  function StackedBar(canvas, parts) {
    this.canvas = canvas;
    this.parts = parts;
    this.draw();
    var self = this;
    canvas.addEventListener("mousemove", function (e) {
      var px = e.clientX - canvas.getBoundingClientRect().left, acc = 0, total = self.total;
      for (var i = 0; i < parts.length; i++) {
        acc += parts[i].value / Math.max(1, total) * self.w;
        if (px <= acc) {
          showTip("<b>" + escapeHtml(parts[i].label) + "</b>: " + fmtBytes(parts[i].value), e.pageX, e.pageY);
          return;
        }
      }
      hideTip();
    });
    canvas.addEventListener("mouseleave", hideTip);
  }
  StackedBar.prototype.draw = function () {
    var parts = this.parts;
    var p = prepare(this.canvas, 46);
    this.w = p.w;
    var ctx = p.ctx, total = 0;
    parts.forEach(function (q) { total += q.value; });
    var x = 0;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    parts.forEach(function (q) {
      var width = q.value / Math.max(1, total) * p.w;
      ctx.fillStyle = q.color;
      ctx.fillRect(x, 4, width, 38);
      if (width > 70) {
        ctx.fillStyle = "#fff";
        ctx.fillText(q.label, x + 5, 17);
        ctx.fillText(fmtShortBytes(q.value), x + 5, 31);
      }
      x += width;
    });
    this.total = total;
  };

  function legend(el, items) {
    el.innerHTML = items.map(function (it) {
      return '<span class="key"><span class="sw' + (it.dash ? " dash" : "") + '" style="' +
        (it.dash ? "border-color:" : "background:") + it.color + '"></span>' + escapeHtml(it.label) + "</span>";
    }).join("");
  }

  function stepMarks(rank) {
    return rank.steps.map(function (s) { return { x: s.event_index, label: "step " + s.step }; });
  }

  function drawReplay(data) {
    var capacity = data.capacity_bytes;
    var hlines = capacity ? [{ y: capacity, label: "capacity " + fmtBytes(capacity), color: "#b00020" }] : [];
    // Side-by-side ranks share one y scale, so that their heights compare.
    var overviewMax = 0;
    data.ranks.forEach(function (rank) {
      rank.policies.forEach(function (p) {
        p.reserved.hi.forEach(function (v) { if (v > overviewMax) overviewMax = v; });
      });
    });
    overviewMax = Math.max(overviewMax, capacity || 0) * 1.08;
    data.ranks.forEach(function (rank) {
      var group = new Group(rank.trace.events);
      var timeline = [], fragmentation = [], keys = [];
      rank.policies.forEach(function (p, i) {
        var color = colorOf(p.report.policy, i);
        timeline.push({ label: p.report.policy + " reserved", color: color, data: p.reserved, width: 2 });
        timeline.push({ label: p.report.policy + " allocated", color: color, data: p.allocated, dash: [5, 3], width: 1.2 });
        fragmentation.push({ label: p.report.policy, color: color, data: p.fragmentation });
        keys.push({ label: p.report.policy + " reserved", color: color });
        keys.push({ label: p.report.policy + " allocated", color: color, dash: true });
      });
      timeline.push({ label: "live in the trace", color: LIVE, data: rank.live, width: 1 });
      keys.push({ label: "live in the trace", color: LIVE });
      var points = [];
      rank.policies.forEach(function (p, i) {
        var oom = p.report.oom;
        if (oom) points.push({ x: oom.event_index, y: oom.reserved_bytes + oom.requested_bytes, color: colorOf(p.report.policy, i) });
      });
      var marks = stepMarks(rank);
      var lg, el = document.querySelector('canvas[data-chart="timeline"][data-rank="' + rank.rank + '"]');
      if (el) {
        record(el, "timeline", new LineChart(el, group, { series: timeline, marks: marks, hlines: hlines, points: points, height: 330 }));
        lg = document.querySelector('[data-legend="timeline"][data-rank="' + rank.rank + '"]');
        if (lg) legend(lg, keys.concat(capacity ? [{ label: "capacity", color: "#b00020", dash: true }] : []));
      }
      el = document.querySelector('canvas[data-chart="fragmentation"][data-rank="' + rank.rank + '"]');
      if (el) {
        lg = document.querySelector('[data-legend="fragmentation"][data-rank="' + rank.rank + '"]');
        if (lg) legend(lg, fragmentation);
        record(el, "fragmentation", new LineChart(el, group, { series: fragmentation, marks: marks, percent: true, yMax: 1, height: 190 }));
      }
      el = document.querySelector('canvas[data-chart="overview"][data-rank="' + rank.rank + '"]');
      if (el) {
        var small = rank.policies.map(function (p, i) {
          return { label: p.report.policy + " reserved", color: colorOf(p.report.policy, i), data: p.reserved, width: 1.5 };
        }).concat([{ label: "live in the trace", color: LIVE, data: rank.live, width: 1 }]);
        lg = document.querySelector('[data-legend="overview"]');
        if (lg && !lg.innerHTML) legend(lg, small.concat(capacity ? [{ label: "capacity", color: "#b00020", dash: true }] : []));
        record(el, "overview", new LineChart(el, new Group(rank.trace.events), { series: small, marks: marks, hlines: hlines, yMax: overviewMax, height: 200 }));
      }
      rank.policies.forEach(function (p, i) {
        var c = document.querySelector('canvas[data-chart="segments"][data-rank="' + rank.rank + '"][data-policy="' + i + '"]');
        if (c) record(c, "segments", new SegmentMap(c, p.peak_map));
      });
    });
  }

  function drawPlan(plan) {
    var phases = plan.phases;
    var values = phases.map(function (p) { return p.allocated_bytes; });
    var series = { len: values.length, step: 1, lo: values, hi: values };
    var hlines = [];
    if (plan.gpu_bytes) hlines.push({ y: plan.gpu_bytes, label: "GPU " + fmtBytes(plan.gpu_bytes), color: "#b00020" });
    hlines.push({ y: plan.peak_reserved_bytes, label: "peak reserved " + fmtBytes(plan.peak_reserved_bytes), color: "#00798c" });
    var marks = phases.map(function (p, i) { return { x: i, label: p.label }; });
    var el = document.querySelector('canvas[data-chart="phases"]');
    if (el) {
      record(el, "phases", new LineChart(el, new Group(values.length), {
        series: [{ label: "allocated", color: "#3a6ea5", data: series, width: 2.5 }],
        marks: marks, hlines: hlines, height: 300, hideX: true
      }));
    }
    el = document.querySelector('canvas[data-chart="breakdown"]');
    if (el) {
      var palette = ["#3a6ea5", "#d1495b", "#edae49", "#00798c", "#6a4c93", "#8ac926", "#8d8d8d", "#30638e"];
      record(el, "breakdown", new StackedBar(el, plan.breakdown.filter(function (b) { return b.bytes > 0; }).map(function (b, i) {
        return { label: b.name, value: b.bytes, color: palette[i % palette.length] };
      })));
    }
  }

  // With #exercise in the address, does on the first line chart what a person does: hovers,
  // drags to zoom, turns the wheel, double-clicks back; publishes what each did, so that a
  // headless browser can check the interactions (they run the same handlers as real input).
  function exercise() {
    var chart = drawn.filter(function (d) { return d instanceof LineChart; })[0];
    if (!chart) return { chart: false };
    var c = chart.canvas, r = c.getBoundingClientRect(), g = chart.group;
    function fire(type, x, target) {
      (target || c).dispatchEvent(new MouseEvent(type, {
        bubbles: true, cancelable: true, clientX: r.left + x, clientY: r.top + 100
      }));
    }
    var seen = { chart: true };
    fire("mousemove", chart.w / 2);
    seen.hover = tip && tip.style.display === "block" ? tip.textContent : "";
    fire("mousedown", chart.w * 0.4);
    fire("mousemove", chart.w * 0.6);
    fire("mouseup", chart.w * 0.6, window);
    seen.zoom = g.x0 > 0 && g.x1 < g.len;
    var span = g.x1 - g.x0;
    c.dispatchEvent(new WheelEvent("wheel", {
      bubbles: true, cancelable: true, clientX: r.left + chart.w / 2, clientY: r.top + 100, deltaY: -100
    }));
    seen.wheel = g.x1 - g.x0 < span;
    fire("dblclick", chart.w / 2);
    seen.reset = g.x0 === 0 && g.x1 === g.len;
    fire("mouseleave", 0);
    return seen;
  }

  function main() {
    var data = JSON.parse(document.getElementById("report-data").textContent);
    if (data.ranks) drawReplay(data);
    if (data.plan) drawPlan(data.plan);
    status.ms = Math.round(performance.now() - started);
    if (location.hash === "#exercise") {
      document.getElementById("render-status").setAttribute("data-exercise", JSON.stringify(exercise()));
    }
    publish();
    window.addEventListener("resize", function () {
      drawn.forEach(function (c) { c.draw(); });
    });
  }
  try { main(); } catch (e) { status.errors++; publish(); throw e; }
})();
