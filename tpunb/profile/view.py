"""The inline view of a Profile: self-contained HTML (no CDN, no website) with a timeline per host
on one time axis (wheel to zoom, drag to pan, double-click to reset, hover for names), the top
ops table, and the straggler called out."""
from __future__ import annotations

import heapq
import html
import importlib.util
import json
import shutil
import uuid

from tpunb.display import format_hosts
from tpunb.profile import summary as tables
from tpunb.profile.summary import origin_ns

#: events the timeline draws (the longest first, over all hosts); the files and tables keep all
VIEW_CAP = 40_000
#: lanes (threads) per host: those calling jitted functions first, then the busiest
LANES_PER_HOST = 4
MAX_DEPTH = 4


def timeline_data(profile, cap: int = VIEW_CAP) -> tuple[dict, list[str]]:
    """What the timeline draws, from the hosts' summaries (plain lists, no DataFrame: this is on the
    way from the cell's end to the view): lanes [host, thread, rows] and events
    [lane, row, start_ns, dur_ns, name index], times from the earliest host's start (start/end in µs)."""
    zero = origin_ns(profile.summaries)
    notes: list[str] = []
    lanes: list[list] = []
    drawable: list[tuple] = []  # (start_ns, dur_ns, lane, host, name)
    dropped = 0
    for host, summary in sorted(profile.summaries.items()):
        load: dict[int, int] = {}
        calls: set[int] = set()  # threads that call jitted functions (the Python thread running the cell)
        kinds = summary["kinds"]
        for event in summary["events"]:
            if event[4] > 0:
                load[event[1]] = load.get(event[1], 0) + event[4]
                if kinds[event[0]] == "jit":
                    calls.add(event[1])
        chosen = sorted(load, key=lambda t: (t in calls, load[t]), reverse=True)
        dropped += max(0, len(chosen) - LANES_PER_HOST)
        lane_of = {}
        for thread in chosen[:LANES_PER_HOST]:
            lane_of[thread] = len(lanes)
            lanes.append([host, summary["threads"][thread], 1])
        names = summary["names"]
        drawable.extend((e[3], e[4], lane_of[e[1]], names[e[0]]) for e in summary["events"]
                        if e[4] > 0 and e[1] in lane_of)
    if dropped:
        notes.append(f"{dropped} quieter threads are not drawn (see .events)")
    if not drawable:
        return {"lanes": [], "events": [], "names": [], "start": 0.0, "end": 1.0}, ["no event with a duration to draw"]
    if len(drawable) > cap:
        notes.append(f"the timeline draws the {cap:,} longest of {len(drawable):,} events")
        drawable = heapq.nlargest(cap, drawable, key=lambda e: e[1])
    drawable.sort(key=lambda e: (e[0], -e[1]))
    name_index: dict[str, int] = {}
    open_ends: dict[int, list] = {}
    rows = []
    for start, duration, lane, name in drawable:
        stack = open_ends.setdefault(lane, [])
        while stack and stack[-1] <= start:
            stack.pop()
        depth = min(len(stack), MAX_DEPTH - 1)
        stack.append(start + duration)
        if depth + 1 > lanes[lane][2]:
            lanes[lane][2] = depth + 1
        index = name_index.get(name)
        if index is None:
            index = name_index[name] = len(name_index)
        rows.append([lane, depth, start - zero, duration, index])  # ns: integers keep the JSON short
    first = drawable[0][0] - zero
    end = max(start + duration for start, duration, _, _ in drawable) - zero
    return {"lanes": lanes, "events": rows, "names": list(name_index), "start": first / 1e3, "end": end / 1e3}, notes


def xprof_line(profile) -> str:
    if shutil.which("xprof") or importlib.util.find_spec("xprof") is not None:
        return f"open in xprof: <code>{html.escape(profile.xprof_command())}</code>"
    return (f"files for xprof or TensorBoard: <code>{html.escape(str(profile.path))}</code> "
            "(<code>pip install xprof</code>, then <code>xprof --logdir ...</code>)")


def straggler_line(profile) -> str:
    host, reason = tables.straggler(profile.summaries)
    steps = tables.steps(profile.summaries)
    step = ""
    if steps is not None:
        medians = ", ".join(f"host {h} {m:.2f} ms" for h, m in sorted(steps.attrs.get("median_ms", {}).items()))
        step = f"{len(steps)} {html.escape(steps.attrs['function'])} steps, median per host: {medians}"
    if host is None:
        return step
    return f"<b>straggler: host {host}</b>: {html.escape(reason)}" + (f"<br>{step}" if step else "")


def top_table(profile, n: int = 10) -> str:
    table = profile.top(n)
    if table.empty:
        return "<p>no jitted function or XLA op in the trace</p>"
    hosts = [c for c in table.columns if c.startswith("host ")]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["name", "kind", "calls", *hosts, "slowest"])
    body = []
    for name, row in table.iterrows():
        cells = [f"<td style='text-align:left;max-width:28em;overflow:hidden;text-overflow:ellipsis;"
                 f"white-space:nowrap' title='{html.escape(str(name))}'>{html.escape(str(name))}</td>",
                 f"<td>{row['kind']}</td>", f"<td>{int(row['calls'])}</td>"]
        for column in hosts:
            bold = int(column.split()[1]) == row["slowest_host"] and len(hosts) > 1
            value = f"{row[column]:.3f}"
            cells.append(f"<td>{'<b>' + value + '</b>' if bold else value}</td>")
        cells.append(f"<td>{row['slowest_host']}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<table class='tpunb-top'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


_SCRIPT = r"""
(function(){
const D = %(data)s, root = document.getElementById('%(id)s');
const cv = root.querySelector('canvas'), tip = root.querySelector('.tip'), ctx = cv.getContext('2d');
for (const e of D.events) { e[2] /= 1e3; e[3] /= 1e3; }
const ROW = 14, GAP = 6, LABEL = 150, AXIS = 18;
let tops = [], y = AXIS;
for (const [h, t, depth] of D.lanes) { tops.push(y); y += depth * ROW + GAP; }
const H = Math.max(y, 40);
let t0 = D.start, t1 = D.end; if (t1 <= t0) t1 = t0 + 1;
const full = [t0, t1];
function hue(i){ let s = D.names[i], h = 0; for (let k = 0; k < s.length; k++) h = (h * 31 + s.charCodeAt(k)) | 0; return 'hsl(' + (Math.abs(h) %% 360) + ',60%%,62%%)'; }
const colors = D.names.map((_, i) => hue(i));
function fmt(us){ return us >= 1e6 ? (us/1e6).toFixed(3)+' s' : us >= 1e3 ? (us/1e3).toFixed(3)+' ms' : us.toFixed(1)+' µs'; }
function draw(){
  const W = root.clientWidth || 900, dpr = window.devicePixelRatio || 1;
  cv.width = W * dpr; cv.height = H * dpr; cv.style.width = W + 'px'; cv.style.height = H + 'px';
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0); ctx.clearRect(0, 0, W, H);
  const sx = (W - LABEL) / (t1 - t0);
  ctx.font = '11px sans-serif'; ctx.textBaseline = 'middle';
  let lastHost = null;
  D.lanes.forEach(([h, t, depth], i) => {
    ctx.fillStyle = (h %% 2) ? 'rgba(127,127,127,0.08)' : 'rgba(127,127,127,0.16)';
    ctx.fillRect(0, tops[i] - GAP/2, W, depth * ROW + GAP);
    ctx.fillStyle = '#888';
    ctx.fillText((h !== lastHost ? 'host ' + h + ' ' : '   ') + t.slice(0, 18), 2, tops[i] + ROW/2);
    lastHost = h;
  });
  for (const [lane, row, s, d, n] of D.events) {
    const x = LABEL + (s - t0) * sx, w = Math.max(d * sx, 0.5);
    if (x > W || x + w < LABEL) continue;
    ctx.fillStyle = colors[n]; const yy = tops[lane] + row * ROW;
    ctx.fillRect(Math.max(x, LABEL), yy, Math.min(w, W - Math.max(x, LABEL)), ROW - 2);
    if (w > 40) { ctx.fillStyle = '#111'; ctx.save(); ctx.beginPath(); ctx.rect(Math.max(x, LABEL), yy, w, ROW); ctx.clip();
      ctx.fillText(D.names[n], Math.max(x, LABEL) + 2, yy + ROW/2 - 1); ctx.restore(); }
  }
  ctx.fillStyle = '#888';
  for (let k = 0; k <= 5; k++) { const t = t0 + (t1 - t0) * k / 5; ctx.fillText(fmt(t), LABEL + (W - LABEL) * k / 5 - (k === 5 ? 60 : 0), 8); }
}
function at(ev){
  const r = cv.getBoundingClientRect(), W = r.width, px = ev.clientX - r.left, py = ev.clientY - r.top;
  const t = t0 + (px - LABEL) * (t1 - t0) / (W - LABEL);
  return [px, py, t, W];
}
cv.addEventListener('wheel', ev => { ev.preventDefault(); const [px, , t] = at(ev); if (px < LABEL) return;
  const f = ev.deltaY > 0 ? 1.25 : 0.8; t0 = t - (t - t0) * f; t1 = t + (t1 - t) * f; draw(); }, {passive: false});
let drag = null;
cv.addEventListener('mousedown', ev => { drag = [ev.clientX, t0, t1]; });
window.addEventListener('mouseup', () => { drag = null; });
cv.addEventListener('dblclick', () => { [t0, t1] = full; draw(); });
cv.addEventListener('mousemove', ev => {
  const [px, py, t, W] = at(ev);
  if (drag) { const dt = (ev.clientX - drag[0]) * (drag[2] - drag[1]) / (W - LABEL); t0 = drag[1] - dt; t1 = drag[2] - dt; draw(); return; }
  let hit = null;
  D.lanes.forEach(([h, th, depth], i) => { if (py >= tops[i] && py < tops[i] + depth * ROW) {
    const row = Math.floor((py - tops[i]) / ROW), slack = 2 * (t1 - t0) / (W - LABEL);
    for (const e of D.events) if (e[0] === i && e[1] === row && e[2] - slack <= t && t <= e[2] + e[3] + slack) hit = [h, th, e]; } });
  if (hit) { const [h, th, e] = hit; tip.style.display = 'block'; tip.style.left = (px + 12) + 'px'; tip.style.top = (py + 12) + 'px';
    tip.textContent = D.names[e[4]] + ' - ' + fmt(e[3]) + ' at ' + fmt(e[2]) + ' (host ' + h + ', ' + th + ')'; }
  else tip.style.display = 'none';
});
cv.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
draw(); window.addEventListener('resize', draw);
})();
"""


def render(profile) -> str:
    """The whole view as one HTML fragment."""
    element = "tpunb-profile-" + uuid.uuid4().hex[:10]
    data, notes = timeline_data(profile)
    total = sum(s["total_events"] for s in profile.summaries.values())
    head = (f"<b>profile {html.escape(profile.name)}</b> of {html.escape(str(profile.meta.get('slice')))}: "
            f"host{'s' if len(profile.hosts) != 1 else ''} {format_hosts(profile.hosts)}, "
            f"{profile.seconds:.2f} s recorded, {total:,} events")
    straggler = straggler_line(profile)
    notes = [html.escape(n) for n in profile.notes + notes]
    script = _SCRIPT % {"data": json.dumps(data, separators=(",", ":")), "id": element}
    return f"""<div id="{element}" class="tpunb-profile" style="font-family:sans-serif;font-size:12px;position:relative">
<div>{head}</div>
{f'<div style="margin:4px 0;padding:4px 8px;border-left:4px solid #d9534f;background:rgba(217,83,79,0.08)">{straggler}</div>' if straggler else ''}
<div style="color:#888">timeline (wheel: zoom, drag: pan, double-click: reset)</div>
<canvas style="display:block;width:100%;cursor:grab"></canvas>
<div class="tip" style="display:none;position:absolute;pointer-events:none;background:#222;color:#eee;padding:2px 6px;border-radius:3px;white-space:nowrap"></div>
<div style="margin-top:6px"><b>top ops and jitted functions</b> (total ms per host; slowest host in bold)</div>
<style>#{element} .tpunb-top td, #{element} .tpunb-top th {{ padding: 1px 8px; text-align: right; }}</style>
{top_table(profile)}
{''.join(f'<div style="color:#a66">{n}</div>' for n in notes)}
<div style="color:#888;margin-top:4px">{xprof_line(profile)}</div>
<script>{script}</script>
</div>"""
