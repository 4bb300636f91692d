//! `gpumem plan --report`: the planned step drawn the way replays are, allocated bytes phase
//! by phase against the GPU, and what the peak consists of.

use std::fmt::Write;

use gpumem_plan::Estimate;
use gpumem_pool::Bytes;
use serde::Serialize;

use crate::html::{esc, page};

/// What the plan page's script draws.
#[derive(Serialize)]
struct PlanData<'a> {
    plan: PlanView<'a>,
}

#[derive(Serialize)]
struct PlanView<'a> {
    phases: Vec<PhaseView>,
    peak_reserved_bytes: u64,
    peak_total_bytes: u64,
    gpu_bytes: Option<u64>,
    breakdown: Vec<BreakdownPart<'a>>,
}

#[derive(Serialize)]
struct PhaseView {
    label: &'static str,
    allocated_bytes: u64,
}

#[derive(Serialize)]
struct BreakdownPart<'a> {
    name: &'a str,
    bytes: u64,
}

/// A plan as one self-contained HTML page: `title` names the run (model and workload),
/// `gpu_bytes` the GPU it must fit, if one was given.
pub fn render_plan(title: &str, estimate: &Estimate, gpu_bytes: Option<u64>) -> String {
    let entries = estimate.breakdown.entries();
    let data = PlanData {
        plan: PlanView {
            phases: estimate
                .phases
                .iter()
                .map(|p| PhaseView {
                    label: p.phase.label(),
                    allocated_bytes: p.allocated_bytes,
                })
                .collect(),
            peak_reserved_bytes: estimate.peak_reserved_bytes,
            peak_total_bytes: estimate.peak_total_bytes,
            gpu_bytes,
            breakdown: entries
                .iter()
                .map(|&(name, bytes)| BreakdownPart { name, bytes })
                .collect(),
        },
    };
    let mut body = String::new();
    let fits = match gpu_bytes {
        None => String::new(),
        Some(gpu) if estimate.peak_total_bytes <= gpu => {
            format!(" It fits the GPU's {}.", Bytes(gpu))
        }
        Some(gpu) => format!(" It does not fit the GPU's {}.", Bytes(gpu)),
    };
    let _ = write!(
        body,
        "<section class=\"card\"><h2>The planned step</h2>\n<p class=\"note\">Peak allocated \
         <b data-field=\"peak_allocated_bytes\" data-value=\"{}\">{}</b> in the {} phase; reserved {}; \
         with CUDA context and framework {}.{}</p>\n\
         <h3>Allocated bytes per phase</h3>\n<canvas data-chart=\"phases\" role=\"img\" aria-label=\"allocated bytes per phase\"></canvas>\n\
         <table><tr><th>phase</th><th>peak allocated</th></tr>\n",
        estimate.peak_allocated_bytes,
        Bytes(estimate.peak_allocated_bytes),
        estimate.peak_phase.label(),
        Bytes(estimate.peak_reserved_bytes),
        Bytes(estimate.peak_total_bytes),
        fits
    );
    for p in &estimate.phases {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td data-field=\"allocated_bytes\" data-value=\"{}\">{}</td></tr>",
            p.phase.label(),
            p.allocated_bytes,
            Bytes(p.allocated_bytes)
        );
    }
    body.push_str(
        "</table>\n<h3>What the peak consists of</h3>\n<canvas data-chart=\"breakdown\" role=\"img\" aria-label=\"what the peak consists of\"></canvas>\n\
         <table><tr><th>part</th><th>bytes</th></tr>\n",
    );
    for (name, bytes) in entries {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td data-field=\"{}\" data-value=\"{bytes}\">{}</td></tr>",
            esc(&name.replace('_', " ")),
            name,
            Bytes(bytes)
        );
    }
    body.push_str("</table></section>\n");
    page(
        &format!("gpumem plan: {title}"),
        "Predicted by gpumem plan, without a GPU. Hover the charts for values.",
        &body,
        &data,
    )
}
