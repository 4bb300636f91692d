//! The page: static HTML for every figure (readable without scripts, and what tests compare),
//! the report's data as JSON, and the inline script that draws the charts from it.

use std::fmt::Write;

use gpumem_pool::Bytes;
use gpumem_replay::tune::{margin_bytes, signed_bytes, TuneReport, Tuned};
use gpumem_replay::PolicyReport;
use serde::Serialize;

use crate::model::{FrameView, LargestLive, RankReport, Report, StackView};

const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// Escapes text for HTML content and attribute values, dropping control characters.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters show as nothing or garble the text around them.
            c if c.is_control() && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// `data` as JSON safe inside a `<script>` element: `<`, `>` and `&` (which JSON has only
/// inside strings) written as `\u003c`, `\u003e`, `\u0026`, so that no `</script>` or
/// `<!--<script>` in the data can end the element early or hide its end.
pub(crate) fn script_json(data: &impl Serialize) -> String {
    let json = serde_json::to_string(data).unwrap_or_else(|_| "{}".to_string());
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            c => out.push(c),
        }
    }
    out
}

/// A whole page: `body` and the charts' `data`, with the style and script inline, so that the
/// file opens offline and alone.
pub(crate) fn page(title: &str, subtitle: &str, body: &str, data: &impl Serialize) -> String {
    let json = script_json(data);
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <header><h1>{title}</h1><p>{subtitle}</p></header>\n<main>\n{body}\
         <div id=\"render-status\" class=\"status\" data-done=\"false\">charts not drawn (scripts off?)</div>\n\
         </main>\n<script type=\"application/json\" id=\"report-data\">{json}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        title = esc(title),
        subtitle = esc(subtitle),
    )
}

/// `count` and `noun`, plural unless one: `1 segment`, `3 segments`.
fn plural(count: usize, noun: &str) -> String {
    format!("{count} {noun}{}", if count == 1 { "" } else { "s" })
}

/// A table cell holding bytes: readable text, and the exact number in `data-value`.
fn bytes_cell(field: &str, bytes: u64) -> String {
    format!(
        "<td data-field=\"{field}\" data-value=\"{bytes}\">{}</td>",
        Bytes(bytes)
    )
}

/// A table cell holding a number, exact in `data-value`.
fn number_cell(field: &str, value: impl std::fmt::Display, text: &str) -> String {
    format!("<td data-field=\"{field}\" data-value=\"{value}\">{text}</td>")
}

/// The report as one self-contained HTML page.
pub fn render(report: &Report) -> String {
    let mut body = String::new();
    if report.ranks.len() > 1 {
        ranks_section(&mut body, report);
    }
    for rank in &report.ranks {
        rank_section(&mut body, rank, report);
    }
    let names: Vec<&str> = report.ranks.iter().map(|r| r.trace.name.as_str()).collect();
    let title = match report.ranks.len() {
        1 => format!("gpumem report: {}", names[0]),
        n => format!("gpumem report: {n} ranks"),
    };
    let policies: Vec<&str> = report
        .ranks
        .first()
        .map(|r| {
            r.policies
                .iter()
                .map(|p| p.report.policy.as_str())
                .collect()
        })
        .unwrap_or_default();
    let subtitle = format!(
        "Replayed through {} on a simulated device{}. Settings: {}. Drag on a chart to zoom, double-click to reset, hover for values.",
        policies.join(", "),
        report
            .capacity_bytes
            .map_or(String::new(), |c| format!(", checked against {}", Bytes(c))),
        report.settings.join("; ")
    );
    page(&title, &subtitle, &body, report)
}

fn ranks_section(out: &mut String, report: &Report) {
    let highest = &report.ranks[report.highest_rank];
    let _ = write!(
        out,
        "<section class=\"card\" id=\"ranks\"><h2>Ranks side by side</h2>\n\
         <p class=\"note\">Rank <b data-field=\"highest_rank\" data-value=\"{}\">{}</b> ({}) peaks highest. \
         The charts share one scale: reserved bytes per policy and the bytes live in the trace.</p>\n\
         <div class=\"scroll\"><table><tr><th rowspan=\"2\">rank</th><th class=\"left\" rowspan=\"2\">trace</th>\
         <th rowspan=\"2\">events</th><th rowspan=\"2\">peak live</th><th colspan=\"{}\" class=\"center\">peak reserved</th></tr>\n<tr>",
        report.highest_rank,
        report.highest_rank,
        esc(&highest.trace.name),
        highest.policies.len()
    );
    for p in &highest.policies {
        let _ = write!(out, "<th>{}</th>", esc(&p.report.policy));
    }
    out.push_str("</tr>\n");
    for rank in &report.ranks {
        let class = match rank.rank == report.highest_rank {
            true => " class=\"highest\"",
            false => "",
        };
        let _ = write!(
            out,
            "<tr{class} data-rank=\"{}\"><td>{}</td><td class=\"left\"><bdi>{}</bdi></td>{}{}",
            rank.rank,
            rank.rank,
            esc(&rank.trace.name),
            number_cell("events", rank.trace.events, &rank.trace.events.to_string()),
            bytes_cell("peak_live_bytes", rank.trace.peak_live_bytes)
        );
        for p in &rank.policies {
            out.push_str(&bytes_cell(
                "peak_reserved_bytes",
                p.report.peak_reserved_bytes,
            ));
        }
        out.push_str("</tr>\n");
    }
    out.push_str(
        "</table></div>\n<div class=\"legend\" data-legend=\"overview\"></div>\n<div class=\"grid\">\n",
    );
    for rank in &report.ranks {
        let _ = writeln!(
            out,
            "<div><h4>rank {}: <bdi>{}</bdi></h4><canvas data-chart=\"overview\" data-rank=\"{}\" role=\"img\" aria-label=\"reserved bytes over time per policy\"></canvas></div>",
            rank.rank,
            esc(&rank.trace.name),
            rank.rank
        );
    }
    out.push_str("</div></section>\n");
}

fn rank_section(out: &mut String, rank: &RankReport, report: &Report) {
    let r = rank.rank;
    let heading = match report.ranks.len() {
        1 => format!("<bdi>{}</bdi>", esc(&rank.trace.name)),
        _ => format!("Rank {r}: <bdi>{}</bdi>", esc(&rank.trace.name)),
    };
    let _ = write!(
        out,
        "<section class=\"card rank\" id=\"rank-{r}\" data-rank=\"{r}\"><h2>{heading}</h2>\n\
         <p class=\"note\">{}{} events · {} steps · peak live {} (bytes as requested)</p>\n",
        match rank.trace.source.is_empty() {
            true => String::new(),
            false => format!("{} · ", esc(&rank.trace.source)),
        },
        rank.trace.events,
        rank.trace.steps,
        Bytes(rank.trace.peak_live_bytes)
    );
    // What the reader left out, under the trace it belongs to.
    for note in &rank.trace.skipped {
        let _ = writeln!(
            out,
            "<p class=\"note skipped\" data-field=\"skipped\">{}</p>",
            esc(note)
        );
    }
    figures_table(out, rank, report.capacity_bytes);
    let _ = write!(
        out,
        "<h3>Memory over time</h3>\n<p class=\"note\">Per event of the trace, on a device without a limit: \
         reserved (solid) and allocated (dashed) per policy; dotted lines mark steps, crosses where a \
         policy runs out of memory at the capacity.</p>\n\
         <div class=\"legend\" data-legend=\"timeline\" data-rank=\"{r}\"></div>\n\
         <canvas data-chart=\"timeline\" data-rank=\"{r}\" role=\"img\" aria-label=\"allocated and reserved bytes over time\"></canvas>\n\
         <h3>Fragmentation over time</h3>\n<p class=\"note\">The share of reserved memory that is not \
         allocated (cached or lost to splitting and rounding); zooms with the chart above.</p>\n\
         <div class=\"legend\" data-legend=\"fragmentation\" data-rank=\"{r}\"></div>\n\
         <canvas data-chart=\"fragmentation\" data-rank=\"{r}\" role=\"img\" aria-label=\"fragmentation over time\"></canvas>\n"
    );
    oom_section(out, rank, report.capacity_bytes);
    let _ = write!(
        out,
        "<h3>Segments at the peak</h3>\n<p class=\"note\">Each policy's segments at the event where its \
         reserved memory peaks, laid end to end in address order and wrapped into rows; a dark tick starts \
         a segment. <span class=\"box\" style=\"background:#3a6ea5\"></span> live \
         <span class=\"box\" style=\"background:#9fd3a5\"></span> cached \
         <span class=\"box\" style=\"background:#d9d9d9\"></span> hole (reserved address space not mapped)</p>\n"
    );
    for (i, p) in rank.policies.iter().enumerate() {
        let map = &p.peak_map;
        let _ = write!(
            out,
            "<h4>{}: {}, {} live of {} at event {}</h4>\n\
             <canvas data-chart=\"segments\" data-rank=\"{r}\" data-policy=\"{i}\" role=\"img\" aria-label=\"segment map\"></canvas>\n",
            esc(&p.report.policy),
            plural(map.segment_count, "segment"),
            Bytes(map.live_bytes),
            Bytes(map.segments.iter().map(|s| s.size).sum()),
            map.event_index
        );
    }
    largest_section(out, rank);
    if let Some(tune) = &rank.tune {
        tune_section(out, tune);
    }
    out.push_str("</section>\n");
}

fn figures_table(out: &mut String, rank: &RankReport, capacity: Option<u64>) {
    let fits = capacity.map_or("fits".to_string(), |c| format!("fits {}", Bytes(c)));
    let _ = writeln!(
        out,
        "<div class=\"scroll\"><table class=\"figures\"><tr><th>policy</th><th>peak allocated</th><th>peak reserved</th>\
         <th>utilization</th><th>device calls</th><th>steady calls/step</th><th>syncs/step</th><th class=\"left\">{}</th></tr>",
        esc(&fits)
    );
    for p in &rank.policies {
        let f = &p.report;
        let steady = f
            .steady_state_alloc_calls_per_step
            .map_or("-".to_string(), |c| c.to_string());
        let _ = writeln!(
            out,
            "<tr data-rank=\"{}\" data-policy=\"{}\"><td>{}</td>{}{}{}{}{}{}<td class=\"left\">{}</td></tr>",
            rank.rank,
            esc(&f.policy),
            esc(&f.policy),
            bytes_cell("peak_allocated_bytes", f.peak_allocated_bytes),
            bytes_cell("peak_reserved_bytes", f.peak_reserved_bytes),
            number_cell(
                "utilization",
                f.utilization,
                &format!("{:.1} %", 100.0 * f.utilization)
            ),
            number_cell("device_calls", f.device_calls, &f.device_calls.to_string()),
            number_cell(
                "steady_state_alloc_calls_per_step",
                f.steady_state_alloc_calls_per_step
                    .map_or("null".to_string(), |c| c.to_string()),
                &steady
            ),
            number_cell(
                "steady_state_syncs_per_step",
                f.steady_state_syncs_per_step
                    .map_or("null".to_string(), |c| c.to_string()),
                &f.steady_state_syncs_per_step
                    .map_or("-".to_string(), |c| c.to_string())
            ),
            esc(&f.fits(capacity))
        );
    }
    out.push_str("</table></div>\n");
    for p in rank.policies.iter().filter(|p| p.report.hazards > 0) {
        let _ = writeln!(
            out,
            "<p class=\"warning\">{}: {} times memory was unmapped, released or lent to another \
             stream while queued work could still use it (the replay's model of asynchronous \
             execution): on a GPU, an illegal memory access or silent corruption.</p>",
            esc(&p.report.policy),
            p.report.hazards
        );
    }
}

fn oom_section(out: &mut String, rank: &RankReport, capacity: Option<u64>) {
    let Some(capacity) = capacity else {
        return;
    };
    let _ = writeln!(out, "<h3>Out of memory at {}</h3>", Bytes(capacity));
    for p in &rank.policies {
        let f = &p.report;
        match &f.oom {
            None => {
                let _ = writeln!(
                    out,
                    "<div class=\"fits\"><b>{}</b> runs the trace in {} (peak reserved {}).</div>",
                    esc(&f.policy),
                    Bytes(capacity),
                    Bytes(f.peak_reserved_bytes)
                );
            }
            Some(o) => {
                let _ = writeln!(
                    out,
                    "<div class=\"oom\" data-policy=\"{}\"><b>{}</b> runs out of memory at event \
                     <b data-field=\"oom_event_index\" data-value=\"{}\">{}</b>{}: the allocation of \
                     <b>{}</b> fails with {} allocated and {} reserved.\n<pre>{}</pre>{}</div>",
                    esc(&f.policy),
                    esc(&f.policy),
                    o.event_index,
                    o.event_index,
                    o.step.map_or(String::new(), |s| format!(" (step {s})")),
                    Bytes(o.requested_bytes),
                    Bytes(o.allocated_bytes),
                    Bytes(o.reserved_bytes),
                    esc(&o.message),
                    p.oom_stack.as_ref().map_or(String::new(), stack_html)
                );
            }
        }
    }
}

/// The user frames of the failing allocation, innermost first, and how many were hidden.
fn stack_html(stack: &StackView) -> String {
    let mut html = String::from(
        "<p class=\"note\">Allocated from (innermost first):</p><ol class=\"frames\">",
    );
    for frame in &stack.frames {
        let _ = write!(html, "<li data-field=\"frame\">{}</li>", frame_html(frame));
    }
    let _ = write!(
        html,
        "</ol><p class=\"note\" data-field=\"hidden_frames\" data-value=\"{}\">{} hidden.</p>",
        stack.hidden,
        plural(stack.hidden, "PyTorch-internal frame"),
    );
    html
}

/// A frame as `function  file:line`.
fn frame_html(frame: &FrameView) -> String {
    format!(
        "<code>{}</code> <span class=\"place\">{}:{}</span>",
        esc(&frame.name),
        esc(&frame.filename),
        frame.line
    )
}

fn largest_section(out: &mut String, rank: &RankReport) {
    let largest = &rank.largest_live;
    if !largest.by_frame.is_empty() {
        return frame_groups_section(out, largest);
    }
    let _ = write!(
        out,
        "<h3>Largest live allocations at the peak</h3>\n<p class=\"note\">At event {} the trace holds \
         {} in {} allocations; the sizes that hold the most:</p>\n\
         <table class=\"largest\"><tr><th>size</th><th>count</th><th>bytes</th><th>share</th><th class=\"left\"></th></tr>\n",
        largest.event_index,
        Bytes(largest.live_bytes),
        largest.live_count
    );
    for g in &largest.groups {
        let share = g.bytes as f64 / largest.live_bytes.max(1) as f64;
        let _ = writeln!(
            out,
            "<tr>{}{}{}<td>{:.1} %</td><td class=\"left\"><span class=\"bar\" style=\"width:{:.0}px\"></span></td></tr>",
            bytes_cell("size", g.size),
            number_cell("count", g.count, &g.count.to_string()),
            bytes_cell("bytes", g.bytes),
            100.0 * share,
            (share * 320.0).max(1.0)
        );
    }
    out.push_str("</table>\n");
}

/// The largest live allocations at the peak grouped by their innermost user frame.
fn frame_groups_section(out: &mut String, largest: &LargestLive) {
    let _ = write!(
        out,
        "<h3>Largest live allocations at the peak</h3>\n<p class=\"note\">At event {} the trace holds \
         {} in {} allocations; the places in the code (innermost user frame) that hold the most:</p>\n\
         <table class=\"largest by-frame\"><tr><th class=\"left\">allocated at</th><th>count</th><th>bytes</th><th>largest</th><th>share</th><th class=\"left\"></th></tr>\n",
        largest.event_index,
        Bytes(largest.live_bytes),
        largest.live_count
    );
    for g in &largest.by_frame {
        let share = g.bytes as f64 / largest.live_bytes.max(1) as f64;
        let place = g
            .frame
            .as_ref()
            .map_or("(no user frame recorded)".to_owned(), frame_html);
        let _ = writeln!(
            out,
            "<tr><td class=\"left\" data-field=\"frame\">{}</td>{}{}{}<td>{:.1} %</td><td class=\"left\"><span class=\"bar\" style=\"width:{:.0}px\"></span></td></tr>",
            place,
            number_cell("count", g.count, &g.count.to_string()),
            bytes_cell("bytes", g.bytes),
            bytes_cell("largest", g.largest),
            100.0 * share,
            (share * 320.0).max(1.0)
        );
    }
    out.push_str("</table>\n");
}

fn tune_section(out: &mut String, tune: &TuneReport) {
    let capacity = tune.capacity_bytes;
    let _ = write!(
        out,
        "<h3>PyTorch allocator settings (gpumem tune)</h3>\n<p class=\"note\">Objective: {}. {} settings \
         replayed in {:.2} s{}. Each row's figures are those of <code>gpumem replay --pytorch-alloc-conf</code> \
         with its setting.</p>\n<div class=\"scroll\"><table class=\"tune\"><tr><th>#</th><th>policy</th><th>peak reserved</th>\
         <th>utilization</th><th>device calls</th><th>steady calls/step</th><th>syncs/step</th><th class=\"left\">fits</th></tr>\n",
        tune.objective,
        tune.replays,
        tune.seconds,
        match tune.complete {
            true => " (search complete)",
            false => " (stopped at the budget)",
        }
    );
    let row = |out: &mut String, rank: &str, name: &str, r: &PolicyReport, setting: &str| {
        let class = if rank == "1" { " class=\"best\"" } else { "" };
        let per_step = |calls: Option<u64>| calls.map_or("-".to_string(), |c| c.to_string());
        let margin = margin_bytes(capacity, r)
            .map_or(String::new(), |m| format!(" (margin {})", signed_bytes(m)));
        let _ = writeln!(
            out,
            "<tr{class}><td>{}</td><td>{}</td>{}<td>{:.1} %</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"left\">{}{}</td></tr>\n<tr{class}><td></td><td class=\"left setting\" colspan=\"7\"><code>{}</code></td></tr>",
            esc(rank),
            esc(name),
            bytes_cell("peak_reserved_bytes", r.peak_reserved_bytes),
            100.0 * r.utilization,
            r.device_calls,
            per_step(r.steady_state_alloc_calls_per_step),
            per_step(r.steady_state_syncs_per_step),
            esc(&r.fits(capacity)),
            esc(&margin),
            esc(setting)
        );
    };
    let tuned = |out: &mut String, rank: &str, t: &Tuned| {
        row(out, rank, t.policy().as_str(), &t.report, &t.export);
    };
    for (i, t) in tune.ranked.iter().enumerate() {
        tuned(out, &(i + 1).to_string(), t);
    }
    if let Some(t) = &tune.best_without_expandable {
        tuned(out, "best w/o expandable", t);
    }
    tuned(out, "PyTorch defaults", &tune.pytorch_default);
    row(
        out,
        "gpumem policy",
        "gpumem",
        &tune.gpumem,
        "GPUMEM_POOL=gpumem",
    );
    out.push_str("</table></div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_cannot_close_or_hide_the_script_and_text_is_escaped() {
        let nasty = "</script><script>alert(1)</script> <!--<script> a&b";
        let html = page(
            "a<b",
            "\"q\" & 'r'",
            "",
            &serde_json::json!({"name": nasty}),
        );
        assert!(html.contains("<title>a&lt;b</title>"));
        assert!(html.contains("&quot;q&quot; &amp; &#39;r&#39;"));
        assert_eq!(
            esc("a\u{1b}[31mb\u{7}\tc"),
            "a[31mb\tc",
            "control characters dropped"
        );
        assert_eq!(html.matches("</script>").count(), 2, "only the page's own");
        let start = html.find("id=\"report-data\">").unwrap() + "id=\"report-data\">".len();
        let end = start + html[start..].find("</script>").unwrap();
        let block = &html[start..end];
        // `<!--` followed by `<script` makes an HTML parser skip the element's own end tag.
        assert!(
            !block.contains("<!--") && !block.contains("<script"),
            "{block}"
        );
        assert!(!block.contains(['<', '>', '&']), "{block}");
        let back: serde_json::Value = serde_json::from_str(block).unwrap();
        assert_eq!(back["name"], nasty);
    }
}
