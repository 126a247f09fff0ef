// The report page's script: draws the charts from the page's JSON data as SVG, and the controls
// (x axis, log scale, outlier clipping, smoothing), the hover readout, the legends' run toggles,
// the sortable tables and --watch's reload. Plain ES2017 with the DOM only: nothing loaded.
#pragma once

namespace loom::report {

inline const char* const page_script = R"JS((function () {
'use strict';
var data = JSON.parse(document.getElementById('loom-data').textContent);
var DASH = ['', '6 3', '2 2', '8 3 2 3'];
var W = 620, PLOT_H = 220, TOP = 8, RIGHT = 14;
var state = {x: data.options.x, log: data.options.log, clip: data.options.clip,
             smoothing: data.options.smoothing, hidden: []};
try {
  var saved = JSON.parse(sessionStorage.getItem('loom-report:' + location.pathname) || 'null');
  if (saved) for (var k in state) if (k in saved) state[k] = saved[k];
} catch (e) {}
function save() {
  try { sessionStorage.setItem('loom-report:' + location.pathname, JSON.stringify(state)); } catch (e) {}
}
function esc(s) {
  return String(s).replace(/[&<>"']/g, function (c) {
    return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
  });
}
// Numbers as loom prints them: 4 significant digits, k/M/G/T rather than exponents.
function num(v) {
  if (v === null || v === undefined) return 'NaN';
  if (!isFinite(v)) return String(v);
  var a = Math.abs(v);
  if (a >= 1e18) return v.toExponential(3).replace(/\.?0+e/, 'e');
  if (a >= 1e4) {
    var p = ['k', 'M', 'G', 'T', 'P'], s = v / 1e3, i = 0;
    while (Math.abs(s) >= 999.95 && i < p.length - 1) { s /= 1e3; i++; }
    return String(+s.toPrecision(4)) + p[i];
  }
  if (a !== 0 && a < 1e-4) return v.toExponential(3).replace(/\.?0+e/, 'e');
  return String(+v.toPrecision(4));
}
function niceTicks(lo, hi, integer) {
  var raw = (hi - lo) / 5, mag = Math.pow(10, Math.floor(Math.log10(raw))), r = raw / mag;
  var step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  if (integer) step = Math.max(1, Math.round(step));
  var out = [];
  for (var i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) out.push(i * step);
  return {ticks: out, step: step};
}
function tickLabel(t, step) {
  if (Math.abs(t) < Math.abs(step) * 1e-9) return '0';
  if (Math.abs(step) >= 1 || Math.abs(t) >= 1e4 || Math.abs(step) < 1e-3) return num(t);
  return t.toFixed(Math.max(0, Math.ceil(-Math.log10(step) - 1e-9)));
}
function quantile(sorted, q) {
  var at = q * (sorted.length - 1), i = Math.floor(at), j = Math.min(i + 1, sorted.length - 1);
  return sorted[i] + (sorted[j] - sorted[i]) * (at - i);
}
// As loom's static charts: leave out of the axis the values more than 10 spreads beyond their own
// series' quartiles, when that narrows the axis at least fivefold.
function yRange(series, clip) {
  var all = [].concat.apply([], series);
  if (!all.length) return [0, 1];
  var lo = Math.min.apply(null, all), hi = Math.max.apply(null, all);
  if (!clip) return [lo, hi];
  var ilo = Infinity, ihi = -Infinity;
  series.forEach(function (values) {
    var flo = -Infinity, fhi = Infinity;
    if (values.length >= 4) {
      var v = values.slice().sort(function (a, b) { return a - b; });
      var q1 = quantile(v, 0.25), q3 = quantile(v, 0.75), med = quantile(v, 0.5);
      var spread = Math.max(q3 - q1, Math.abs(med) * 0.05, 1e-300);
      flo = q1 - 10 * spread; fhi = q3 + 10 * spread;
    }
    values.forEach(function (x) { if (x >= flo && x <= fhi) { ilo = Math.min(ilo, x); ihi = Math.max(ihi, x); } });
  });
  if (!(ihi >= ilo)) return [lo, hi];
  var kept = ihi - ilo || Math.abs(ihi) * 0.05 || 1e-300;
  if (hi - lo < 5 * kept) return [lo, hi];
  return [ilo, ihi];
}
// TensorBoard's smoothing: an exponential moving average, debiased; a gap stays a gap.
function smooth(ys, w) {
  var last = 0, n = 0;
  return ys.map(function (y) {
    if (y === null || !isFinite(y)) return null;
    last = last * w + (1 - w) * y; n++;
    return w > 0 ? last / (1 - Math.pow(w, n)) : y;
  });
}
function timeUnit() {
  var span = 0;
  data.charts.forEach(function (c) { c.series.forEach(function (s) {
    s.points.forEach(function (p) { if (p[2] !== null) span = Math.max(span, p[2]); });
  }); });
  return span > 7200 ? [3600, 'hours'] : span > 300 ? [60, 'minutes'] : [1, 'seconds'];
}
var views = {};

function prepare(chart) {
  var unit = timeUnit(), missing = {};
  var series = [];
  chart.series.forEach(function (s) {
    if (state.hidden.indexOf(s.run) >= 0) return;
    var run = data.runs[s.run];
    var xs = [], ys = [], steps = [];
    s.points.forEach(function (p) {
      var x = state.x === 'step' ? p[0] : state.x === 'tokens' ? (run.tokens_per_step > 0 ? p[0] * run.tokens_per_step : null)
                                                              : (p[2] === null ? null : p[2] / unit[0]);
      if (x === null) { missing[run.label] = true; return; }
      xs.push(x); ys.push(p[1]); steps.push(p[0]);
    });
    if (!xs.length) return;
    // Evaluations and a schedule (the learning rate) are not noise: never smoothed.
    var plain = s.eval || chart.smooth === false;
    var sm = plain ? ys : smooth(ys, state.smoothing);
    series.push({run: s.run, label: run.label + (chart.metrics > 1 ? ' ' + s.metric : ''), colour: run.colour,
                 dash: DASH[s.style % DASH.length], eval: s.eval, plain: plain, xs: xs, ys: ys, sm: sm, steps: steps});
  });
  return {series: series, missing: Object.keys(missing), unit: unit};
}

function draw(chart) {
  var box = document.getElementById('chart-' + chart.id);
  var prep = prepare(chart), series = prep.series;
  var fy = function (y) { return y === null || !isFinite(y) ? null : state.log ? (y > 0 ? Math.log10(y) : null) : y; };
  var x0 = Infinity, x1 = -Infinity, vals = [];
  series.forEach(function (s) {
    var own = [];
    s.xs.forEach(function (x, i) {
      x0 = Math.min(x0, x); x1 = Math.max(x1, x);
      var y = fy(s.ys[i]); if (y !== null) own.push(y);
    });
    vals.push(own);
  });
  var r = yRange(vals, state.clip), y0 = r[0], y1 = r[1], clipped = 0;
  vals.forEach(function (own) { own.forEach(function (y) { if (y < y0 || y > y1) clipped++; }); });
  if (!(x1 > x0)) { x0 -= 0.5; x1 += 0.5; }
  if (!(y1 > y0)) { var pd = y0 === 0 ? 1 : Math.abs(y0) * 0.05; y0 -= pd; y1 += pd; }
  var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  var yt, ylabels;
  if (state.log) {
    yt = [];
    var every = Math.max(1, Math.ceil((y1 - y0) / 8));  // at most about 8 labels
    for (var e = Math.ceil(Math.floor(y0) / every) * every; e <= y1; e += every)
      (y1 - y0 < 3 ? [1, 2, 5] : [1]).forEach(function (m) { var t = e + Math.log10(m); if (t >= y0 && t <= y1) yt.push(t); });
    ylabels = yt.map(function (t) { return num(+Math.pow(10, t).toPrecision(6)); });
    if (yt.length < 2) {  // less than a factor of 2 or 5 tall: round values between, placed on the log axis
      var lin = niceTicks(Math.pow(10, y0), Math.pow(10, y1), false);
      var kept = lin.ticks.filter(function (t) { return t > 0; });
      yt = kept.map(function (t) { return Math.log10(t); });
      ylabels = kept.map(function (t) { return tickLabel(t, lin.step); });
    }
  } else {
    var ny = niceTicks(y0, y1, false); yt = ny.ticks;
    ylabels = yt.map(function (t) { return tickLabel(t, ny.step); });
  }
  var widest = ylabels.reduce(function (m, l) { return Math.max(m, l.length); }, 1);
  var left = 28 + 7 * widest + 6, plotW = W - left - RIGHT, H = TOP + PLOT_H + 40;
  var px = function (x) { return left + (x - x0) / (x1 - x0) * plotW; };
  var py = function (y) { return TOP + PLOT_H - (Math.min(Math.max(y, y0), y1) - y0) / (y1 - y0) * PLOT_H; };
  var o = [];
  o.push('<svg class="plot-svg" width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + ' ' + H +
         '" font-family="sans-serif" font-size="12">');
  o.push('<rect class="frame" x="' + left + '" y="' + TOP + '" width="' + plotW + '" height="' + PLOT_H + '" fill="#fff" stroke="#888"/>');
  yt.forEach(function (t, i) {
    o.push('<line x1="' + left + '" x2="' + (left + plotW) + '" y1="' + py(t).toFixed(1) + '" y2="' + py(t).toFixed(1) + '" stroke="#e6e6e6"/>');
    o.push('<text class="ytick" x="' + (left - 6) + '" y="' + (py(t) + 4).toFixed(1) + '" text-anchor="end">' + esc(ylabels[i]) + '</text>');
  });
  var nx = niceTicks(x0, x1, state.x !== 'time');
  nx.ticks.forEach(function (t) {
    o.push('<line x1="' + px(t).toFixed(1) + '" x2="' + px(t).toFixed(1) + '" y1="' + (TOP + PLOT_H) + '" y2="' + (TOP + PLOT_H + 4) + '" stroke="#888"/>');
    o.push('<text class="xtick" x="' + px(t).toFixed(1) + '" y="' + (TOP + PLOT_H + 17) + '" text-anchor="middle">' + esc(tickLabel(t, nx.step)) + '</text>');
  });
  var xlabel = state.x === 'time' ? 'time (' + prep.unit[1] + ')' : state.x;
  o.push('<text class="xlabel" x="' + (left + plotW / 2) + '" y="' + (TOP + PLOT_H + 34) + '" text-anchor="middle">' + esc(xlabel) + '</text>');
  o.push('<text class="ylabel" transform="translate(18 ' + (TOP + PLOT_H / 2) + ') rotate(-90)" text-anchor="middle">' +
         esc(chart.y + (state.log ? ' (log)' : '')) + '</text>');
  if (chart.reference > 0 && fy(chart.reference) !== null && fy(chart.reference) >= y0 && fy(chart.reference) <= y1)
    o.push('<line class="reference" x1="' + left + '" x2="' + (left + plotW) + '" y1="' + py(fy(chart.reference)).toFixed(1) +
           '" y2="' + py(fy(chart.reference)).toFixed(1) + '" stroke="#a33" stroke-dasharray="3 3"/>');
  function path(s, ys, cls, opacity) {
    var d = '', open = false, marks = '', drawn = 0;
    s.xs.forEach(function (x, i) {
      var y = fy(ys[i]);
      if (y === null) { open = false; return; }
      drawn++;
      var X = px(x).toFixed(1), Y = py(y).toFixed(1);
      d += (open ? 'L' : 'M') + X + ',' + Y; open = true;
      if (y > y1 || y < y0) {
        var dy = y > y1 ? 6 : -6;
        marks += '<path class="clipped" d="M' + (px(x) - 4).toFixed(1) + ',' + (py(y) + dy).toFixed(1) + 'L' +
                 (px(x) + 4).toFixed(1) + ',' + (py(y) + dy).toFixed(1) + 'L' + X + ',' + Y + 'Z" fill="' + s.colour + '"/>';
      } else if (s.eval || ((i === 0 || fy(ys[i - 1]) === null) && (i + 1 === s.xs.length || fy(ys[i + 1]) === null))) {
        marks += '<circle cx="' + X + '" cy="' + Y + '" r="3" fill="' + s.colour + '"' + (opacity < 1 ? ' opacity="' + opacity + '"' : '') + '/>';
      }
    });
    return '<g class="' + cls + '" data-run="' + esc(data.runs[s.run].label) + '" data-points="' + drawn + '"><title>' + esc(s.label) +
           '</title><path d="' + d + '" fill="none" stroke="' + s.colour + '" stroke-width="1.8"' +
           (s.dash ? ' stroke-dasharray="' + s.dash + '"' : '') + (opacity < 1 ? ' stroke-opacity="' + opacity + '"' : '') +
           '/>' + marks + '</g>';
  }
  var smoothing = state.smoothing > 0;
  series.forEach(function (s) {
    o.push(path(s, s.ys, 'series raw', smoothing && !s.plain ? 0.25 : 1));
    if (smoothing && !s.plain) o.push(path(s, s.sm, 'series smoothed', 1));
  });
  o.push('<line class="cursor" x1="0" x2="0" y1="' + TOP + '" y2="' + (TOP + PLOT_H) + '" stroke="#555" visibility="hidden"/>');
  o.push('<g class="hover-dots"></g>');
  o.push('<rect class="hover-area" x="' + left + '" y="' + TOP + '" width="' + plotW + '" height="' + PLOT_H + '" fill="transparent"/>');
  o.push('</svg>');
  box.querySelector('.plot').innerHTML = o.join('');
  var notes = chart.notes.slice();
  if (clipped) notes.push(clipped + (clipped === 1 ? ' value lies' : ' values lie') +
                          ' far outside the rest: drawn as triangles at the edge (untick "clip outliers" to see all)');
  if (prep.missing.length) notes.push(prep.missing.join(', ') + ': not drawn on this axis (' +
                                      (state.x === 'tokens' ? 'no tokens per step in its config.yaml' : 'no throughput/elapsed_seconds logged') + ')');
  box.querySelector('.notes').innerHTML = notes.map(function (n) { return '<p class="note">' + esc(n) + '</p>'; }).join('');
  var legend = [];
  chart.series.forEach(function (s) {
    var run = data.runs[s.run], off = state.hidden.indexOf(s.run) >= 0;
    legend.push('<span class="entry' + (off ? ' off' : '') + '" data-run="' + s.run + '" title="show or hide this run in every chart">' +
                '<svg width="26" height="10"><line x1="1" x2="25" y1="5" y2="5" stroke="' + run.colour + '" stroke-width="2.5"' +
                (DASH[s.style % DASH.length] ? ' stroke-dasharray="' + DASH[s.style % DASH.length] + '"' : '') + '/></svg>' +
                esc(run.label + (chart.metrics > 1 ? ' ' + s.metric : '')) + '</span>');
  });
  box.querySelector('.legend').innerHTML = legend.join('');
  views[chart.id] = {series: series, x0: x0, x1: x1, left: left, plotW: plotW, px: px, py: py, fy: fy};
}

function hover(chart, event) {
  var v = views[chart.id], box = document.getElementById('chart-' + chart.id);
  var svg = box.querySelector('svg'), tip = box.querySelector('.tooltip');
  var rect = svg.getBoundingClientRect(), mx = event.clientX - rect.left;
  var cursor = svg.querySelector('.cursor'), dots = svg.querySelector('.hover-dots');
  if (!v || !v.series.length || mx < v.left || mx > v.left + v.plotW) {
    cursor.setAttribute('visibility', 'hidden'); dots.innerHTML = ''; tip.hidden = true; return;
  }
  var xv = v.x0 + (mx - v.left) / v.plotW * (v.x1 - v.x0), best = null, bestStep = null;
  v.series.forEach(function (s) { s.xs.forEach(function (x, i) {
    if (best === null || Math.abs(x - xv) < Math.abs(best - xv)) { best = x; bestStep = s.steps[i]; }
  }); });
  var lines = [], marks = '';
  var head = state.x === 'step' ? 'step ' + bestStep : state.x + ' ' + num(best) + ' (step ' + bestStep + ')';
  v.series.forEach(function (s) {
    var k = -1;
    s.xs.forEach(function (x, i) { if (k < 0 || Math.abs(x - best) < Math.abs(s.xs[k] - best)) k = i; });
    if (k < 0) return;
    var shown = state.smoothing > 0 && !s.plain ? s.sm[k] : s.ys[k];
    var text = num(shown) + (state.smoothing > 0 && !s.plain ? ' (raw ' + num(s.ys[k]) + ')' : '') +
               (s.steps[k] !== bestStep ? ' at step ' + s.steps[k] : '');
    lines.push('<div class="row" data-run="' + esc(data.runs[s.run].label) + '"><span class="swatch" style="background:' + s.colour +
               '"></span>' + esc(s.label) + ': <b>' + esc(text) + '</b></div>');
    var y = v.fy(shown);
    if (y !== null) marks += '<circle cx="' + v.px(s.xs[k]).toFixed(1) + '" cy="' + v.py(y).toFixed(1) + '" r="4" fill="none" stroke="' + s.colour + '" stroke-width="2"/>';
  });
  cursor.setAttribute('x1', v.px(best)); cursor.setAttribute('x2', v.px(best)); cursor.setAttribute('visibility', 'visible');
  dots.innerHTML = marks;
  tip.innerHTML = '<div class="head">' + esc(head) + '</div>' + lines.join('');
  tip.hidden = false;
  var tx = v.px(best) + 14;
  if (tx + 340 > W) tx = Math.max(0, v.px(best) - 354);
  tip.style.left = tx + 'px';
}

function drawAll() {
  data.charts.forEach(draw);
  save();
}

function controls() {
  var xs = document.getElementById('x-axis'), log = document.getElementById('log-y');
  var clip = document.getElementById('clip'), sm = document.getElementById('smoothing');
  var smv = document.getElementById('smoothing-value');
  Array.prototype.forEach.call(xs.options, function (opt) {
    var ok = opt.value === 'step' || data.runs.some(function (r) { return opt.value === 'tokens' ? r.tokens_per_step > 0 : r.has_time; });
    opt.disabled = !ok;
    if (!ok && state.x === opt.value) state.x = 'step';
  });
  xs.value = state.x; log.checked = state.log; clip.checked = state.clip; sm.value = state.smoothing;
  smv.textContent = Number(state.smoothing).toFixed(2);
  xs.addEventListener('change', function () { state.x = xs.value; drawAll(); });
  log.addEventListener('change', function () { state.log = log.checked; drawAll(); });
  clip.addEventListener('change', function () { state.clip = clip.checked; drawAll(); });
  sm.addEventListener('input', function () { state.smoothing = +sm.value; smv.textContent = (+sm.value).toFixed(2); drawAll(); });
}

function charts() {
  var root = document.getElementById('charts');
  root.innerHTML = data.charts.map(function (c) {
    return '<div class="chart" id="chart-' + esc(c.id) + '" data-chart="' + esc(c.id) + '"><h3>' + esc(c.title) +
           '</h3><div class="notes"></div><div class="plot"></div><div class="tooltip" hidden></div><div class="legend"></div></div>';
  }).join('') || '<p>No metrics logged yet.</p>';
  data.charts.forEach(function (c) {
    var box = document.getElementById('chart-' + c.id);
    box.querySelector('.plot').addEventListener('mousemove', function (e) { hover(c, e); });
    box.querySelector('.plot').addEventListener('mouseleave', function (e) { hover(c, {clientX: -1e9}); });
    box.querySelector('.legend').addEventListener('click', function (e) {
      var entry = e.target.closest('.entry'); if (!entry) return;
      var run = +entry.dataset.run, at = state.hidden.indexOf(run);
      if (at >= 0) state.hidden.splice(at, 1); else state.hidden.push(run);
      drawAll();
    });
  });
}

function sortable() {
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'), function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener('click', function () {
        var asc = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
        var numeric = th.dataset.type === 'number', body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[col].dataset.sort, y = b.cells[col].dataset.sort;
          if (x === '' || y === '') return x === y ? 0 : x === '' ? 1 : -1;  // unknown last, either way
          var c = numeric ? (+x) - (+y) : x.localeCompare(y);
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
}

charts();
controls();
drawAll();
sortable();
document.body.setAttribute('data-ready', 'true');
if (data.options.reload > 0) setTimeout(function () { save(); location.reload(); }, data.options.reload * 1000);
})();
)JS";

}  // namespace loom::report
