//! `gpumem report` as a person uses it: the page rendered in headless Chromium (a screenshot
//! whose chart areas must hold the charts' colours, the page's own render status with no
//! script errors, and the figures on the page equal to `gpumem replay --json`), several ranks
//! side by side, and clear errors that leave no file behind for bad input.
//!
//! Chromium comes from `scripts/install-test-deps.sh` (Debian package `chromium`). Without it
//! the browser tests fail with what to install, or skip when the user opted out of missing
//! test dependencies (`gpumem_testkit::deps`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gpumem, json_of, testdata};
use gpumem_testkit::deps;

const BERT: &str = "bert-12l-train-b8-s128.jsonl.gz";
const SMALL: &str = "small-gpt2-2l-infer-b1-s32.jsonl.gz";

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-report-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The Chromium binary; when it is missing the rule for a missing test dependency applies (a
/// failure, or `None` after a `SKIPPED:` line when the user opted out).
fn chromium() -> Option<PathBuf> {
    let found = deps::find_on_path(&["chromium", "chromium-browser"])
        .ok_or("neither chromium nor chromium-browser is on PATH");
    deps::require(deps::CHROMIUM, found)
}

/// Width and height of the browser window for both the DOM dump and the screenshot, so that
/// the chart rectangles the page reports are where the screenshot has them.
const WINDOW: (u32, u32) = (1280, 2400);

/// Runs headless Chromium on `page` with `what` (`--dump-dom` or `--screenshot=PATH`),
/// letting the page's scripts run first; returns stdout.
fn browse(browser: &Path, page: &Path, what: &str, dir: &Path) -> String {
    let profile = dir.join(format!("profile-{}", what.len()));
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--window-size={},{}", WINDOW.0, WINDOW.1),
            "--virtual-time-budget=5000",
            what,
            &format!("file://{}", page.display()),
        ])
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of attribute `name` in the first tag of `html` that contains `marker`.
fn attribute(html: &str, marker: &str, name: &str) -> String {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not on the page"));
    let tag_end = at + html[at..].find('>').unwrap();
    let tag_start = html[..at].rfind('<').unwrap();
    let tag = &html[tag_start..tag_end];
    let key = format!("{name}=\"");
    let start = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    let end = start + tag[start..].find('"').unwrap();
    tag[start..end].replace("&quot;", "\"")
}

/// The exact values (`data-value`) of the cells of the table row that starts at `marker`,
/// by field name.
fn row_values(html: &str, marker: &str) -> Vec<(String, String)> {
    let start = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not on the page"));
    let row = &html[start..start + html[start..].find("</tr>").unwrap()];
    row.split("data-field=\"")
        .skip(1)
        .map(|cell| {
            let field = &cell[..cell.find('"').unwrap()];
            let value_at = cell.find("data-value=\"").unwrap() + "data-value=\"".len();
            let value = &cell[value_at..value_at + cell[value_at..].find('"').unwrap()];
            (field.to_string(), value.to_string())
        })
        .collect()
}

/// The render status the page's script published: charts drawn and their rectangles.
fn render_status(dom: &str) -> (u64, Vec<serde_json::Value>) {
    let marker = "id=\"render-status\"";
    assert_eq!(
        attribute(dom, marker, "data-done"),
        "true",
        "the script ran"
    );
    assert_eq!(
        attribute(dom, marker, "data-errors"),
        "0",
        "no script errors"
    );
    let charts: u64 = attribute(dom, marker, "data-charts").parse().unwrap();
    let rects: Vec<serde_json::Value> =
        serde_json::from_str(&attribute(dom, marker, "data-rects")).unwrap();
    (charts, rects)
}

/// An RGB image decoded from a PNG file.
struct Image {
    width: u32,
    height: u32,
    rgb: Vec<[u8; 3]>,
}

fn decode(path: &Path) -> Image {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    let rgb = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    Image {
        width: info.width,
        height: info.height,
        rgb,
    }
}

impl Image {
    /// Pixels inside `rect` (page coordinates as the page reported them) within `tolerance`
    /// of `colour` on every channel.
    fn count(&self, rect: &serde_json::Value, colour: [u8; 3], tolerance: u8) -> usize {
        let n = |k: &str| rect[k].as_u64().unwrap() as u32;
        let (x0, y0) = (n("x"), n("y"));
        let (x1, y1) = (
            (x0 + n("w")).min(self.width),
            (y0 + n("h")).min(self.height),
        );
        let mut hits = 0;
        for y in y0..y1 {
            for x in x0..x1 {
                let p = self.rgb[(y * self.width + x) as usize];
                if (0..3).all(|c| p[c].abs_diff(colour[c]) <= tolerance) {
                    hits += 1;
                }
            }
        }
        hits
    }
}

#[test]
fn the_report_draws_in_a_browser_with_the_replays_figures() {
    let Some(browser) = chromium() else {
        return;
    };
    let dir = scratch("browser");
    let page = dir.join("bert.html");
    let trace = testdata(BERT);
    let out = gpumem(&[
        "report",
        &trace,
        "-o",
        page.to_str().unwrap(),
        "--capacity",
        "800MiB",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "the page loads nothing from the network"
    );

    let dom = browse(&browser, &page, "--dump-dom", &dir);
    let (charts, rects) = render_status(&dom);
    // A timeline and a fragmentation chart, and a segment map per policy (4).
    assert_eq!(charts, 6, "{rects:?}");

    // Hover, drag to zoom, wheel and double-click on the timeline, through its own handlers.
    let exercised = browse(
        &browser,
        &page.with_extension("html#exercise"),
        "--dump-dom",
        &dir,
    );
    render_status(&exercised);
    let seen: serde_json::Value = serde_json::from_str(&attribute(
        &exercised,
        "id=\"render-status\"",
        "data-exercise",
    ))
    .unwrap();
    assert!(
        seen["hover"].as_str().unwrap().contains("torch reserved"),
        "{seen}"
    );
    for what in ["zoom", "wheel", "reset"] {
        assert_eq!(seen[what], true, "{what}: {seen}");
    }

    // The figures on the page are those `gpumem replay --json` prints.
    let replay = json_of(&gpumem(&[
        "replay",
        &trace,
        "--capacity",
        "800MiB",
        "--json",
    ]));
    let policies = replay["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 4);
    for p in policies {
        let name = p["policy"].as_str().unwrap();
        let cells = row_values(
            &dom,
            &format!("<tr data-rank=\"0\" data-policy=\"{name}\">"),
        );
        assert_eq!(cells.len(), 6, "{cells:?}");
        for (field, value) in cells {
            match &p[&field] {
                serde_json::Value::Null => assert_eq!(value, "null", "{name} {field}"),
                // Integers exactly; the utilisation to the last bit or so (serde_json reads
                // floats to within one unit in the last place).
                v => match v.as_u64() {
                    Some(n) => assert_eq!(value, n.to_string(), "{name} {field}"),
                    None => {
                        let (page, json) = (value.parse::<f64>().unwrap(), v.as_f64().unwrap());
                        assert!(
                            (page - json).abs() <= 1e-12,
                            "{name} {field}: {page} vs {json}"
                        );
                    }
                },
            }
        }
        if let Some(oom) = p["oom"].as_object() {
            let marker = format!("class=\"oom\" data-policy=\"{name}\"");
            let block = &dom[dom.find(&marker).unwrap()..];
            let shown = attribute(block, "data-field=\"oom_event_index\"", "data-value");
            assert_eq!(shown, oom["event_index"].to_string());
        }
    }
    assert!(
        policies.iter().any(|p| !p["oom"].is_null()),
        "torch runs out of memory on 800 MiB, so the page shows an OOM point"
    );

    // The charts drew: their areas in a screenshot hold the colours they draw with.
    let shot = dir.join("shot.png");
    browse(
        &browser,
        &page,
        &format!("--screenshot={}", shot.display()),
        &dir,
    );
    let image = decode(&shot);
    assert_eq!((image.width, image.height), WINDOW);
    let chart = |kind: &str| {
        rects
            .iter()
            .find(|r| r["chart"] == kind)
            .unwrap_or_else(|| panic!("no {kind} chart"))
    };
    let (torch, gpumem_teal, live_blue) =
        ([0xd1, 0x49, 0x5b], [0x00, 0x79, 0x8c], [0x3a, 0x6e, 0xa5]);
    for kind in ["timeline", "fragmentation"] {
        for colour in [torch, gpumem_teal] {
            let hits = image.count(chart(kind), colour, 30);
            assert!(hits > 100, "{kind}: {hits} pixels of {colour:?}");
        }
    }
    let segments = chart("segments");
    let area = (segments["w"].as_u64().unwrap() * segments["h"].as_u64().unwrap()) as usize;
    let live = image.count(segments, live_blue, 30);
    assert!(live > area / 4, "segment map: {live} live pixels of {area}");
    // A map fills every row to the end: its last row (20 px high) is drawn all across.
    for map in rects.iter().filter(|r| r["chart"] == "segments") {
        let (y, h) = (map["y"].as_u64().unwrap(), map["h"].as_u64().unwrap());
        if y + h > u64::from(WINDOW.1) {
            continue;
        }
        let band = serde_json::json!({"x": map["x"], "y": y + h - 18, "w": map["w"], "h": 16});
        let blank = image.count(&band, [255, 255, 255], 0) as u64;
        let band_area = map["w"].as_u64().unwrap() * 16;
        assert!(
            blank * 100 < band_area,
            "{map}: {blank} blank pixels in its last row"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn several_ranks_show_side_by_side_with_the_highest() {
    let (small, bert) = (testdata(SMALL), testdata(BERT));
    let replay = json_of(&gpumem(&[
        "replay", &small, &bert, "--policy", "torch", "--json",
    ]));
    assert_eq!(replay["highest_rank"], 1);
    assert_eq!(replay["ranks"].as_array().unwrap().len(), 2);
    let text = gpumem(&["replay", &small, &bert, "--policy", "torch"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("Rank 0:") && text.contains("Rank 1:"),
        "{text}"
    );
    assert!(
        text.contains("Rank 1 (bert-12l-train-b8-s128) peaks highest"),
        "{text}"
    );

    let dir = scratch("ranks");
    let page = dir.join("ranks.html");
    let out = gpumem(&[
        "report",
        &small,
        &bert,
        "-o",
        page.to_str().unwrap(),
        "--policy",
        "torch",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("2 ranks; rank 1"), "{stdout}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(
        attribute(&html, "data-field=\"highest_rank\"", "data-value"),
        replay["highest_rank"].to_string()
    );
    for rank in [0, 1] {
        let cells = row_values(
            &html,
            &format!("<tr data-rank=\"{rank}\" data-policy=\"torch\">"),
        );
        let expected = &replay["ranks"][rank]["policies"][0]["peak_reserved_bytes"];
        assert!(cells.contains(&("peak_reserved_bytes".to_string(), expected.to_string())));
    }
    if let Some(browser) = chromium() {
        let (charts, _) = render_status(&browse(&browser, &page, "--dump-dom", &dir));
        // Per rank an overview, a timeline, a fragmentation chart and one segment map.
        assert_eq!(charts, 8);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `gpumem report` expecting a failure; returns its message, after checking that the
/// output directory holds no file.
fn refused(dir: &Path, args: &[&str]) -> String {
    let out = gpumem(args);
    assert_eq!(out.status.code(), Some(2), "{args:?} must fail");
    let entries: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(entries.is_empty(), "{args:?} left {entries:?}");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn bad_input_is_refused_clearly_and_leaves_no_file() {
    let dir = scratch("bad");
    let out_dir = dir.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let page = out_dir.join("r.html");
    let page = page.to_str().unwrap();
    let bert = testdata(BERT);

    let empty = dir.join("empty.jsonl");
    std::fs::write(
        &empty,
        "{\"gpumem_trace\": 1, \"name\": \"empty\"}\n{\"op\": \"step\", \"index\": 0}\n",
    )
    .unwrap();
    let message = refused(&out_dir, &["report", empty.to_str().unwrap(), "-o", page]);
    assert!(message.contains("allocates nothing"), "{message}");
    let message = refused(&out_dir, &["tune", empty.to_str().unwrap()]);
    assert!(message.contains("no placement to tune"), "{message}");

    let message = refused(
        &out_dir,
        &["report", &bert, "-o", page, "--capacity", "100MiB"],
    );
    assert!(
        message.contains("capacity 100.00 MiB") && message.contains("peak live bytes 761.84 MiB"),
        "{message}"
    );

    let missing = dir.join("no-such-dir").join("r.html");
    let message = refused(
        &out_dir,
        &["report", &bert, "-o", missing.to_str().unwrap()],
    );
    assert!(
        message.contains("cannot write") && message.contains("no-such-dir"),
        "{message}"
    );

    // The output path is a directory: the page is written beside it and never renamed over it.
    let taken = out_dir.join("taken.html");
    std::fs::create_dir(&taken).unwrap();
    let out = gpumem(&[
        "report",
        &bert,
        "-o",
        taken.to_str().unwrap(),
        "--policy",
        "torch",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8(out.stderr).unwrap();
    assert!(
        message.contains("cannot write") && message.contains("taken.html"),
        "{message}"
    );
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec!["taken.html"], "no partial page beside it");

    // `gpumem replay --snapshot` writes the same way: nothing partial beside the directory.
    let out = gpumem(&[
        "replay",
        &bert,
        "--policy",
        "torch",
        "--snapshot",
        taken.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let left: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec!["taken.html"], "no partial snapshot beside it");

    // A directory named as the output, with or without a trailing slash: said so, before any
    // work, and nothing is written.
    let pages = dir.join("pages");
    std::fs::create_dir(&pages).unwrap();
    let pages_str = pages.to_str().unwrap().to_string();
    for named in [pages_str.clone(), format!("{pages_str}/")] {
        let message = refused(&pages, &["report", &bert, "-o", &named]);
        assert!(
            message.contains("it is a directory") && message.contains("report.html"),
            "{message}"
        );
    }
    // The output is one of the traces: refused, and the trace is left as it was.
    let trace_copy = dir.join("trace.jsonl");
    let trace_text = "{\"gpumem_trace\": 1, \"name\": \"t\"}\n{\"op\": \"alloc\", \"addr\": 4096, \"size\": 512}\n";
    std::fs::write(&trace_copy, trace_text).unwrap();
    let trace_arg = trace_copy.to_str().unwrap();
    let message = refused(&pages, &["report", &bert, trace_arg, "-o", trace_arg]);
    assert!(message.contains("it is the trace"), "{message}");
    assert_eq!(std::fs::read_to_string(&trace_copy).unwrap(), trace_text);

    let no_trace_dir = dir.join("no-trace");
    std::fs::create_dir(&no_trace_dir).unwrap();
    let message = refused(&no_trace_dir, &["report", "-o", page]);
    assert!(message.contains("<TRACES>"), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plan_report_draws_the_planned_phases() {
    let dir = scratch("plan");
    let page = dir.join("plan.html");
    let args = [
        "plan", "--model", "gpt2", "--mode", "train", "--batch", "4", "--seq", "512", "--gpu",
        "rtx-4090",
    ];
    let plan = json_of(&gpumem(&[&args[..], &["--json"]].concat()));
    let mut with_report = args.to_vec();
    with_report.extend(["--report", page.to_str().unwrap()]);
    let out = gpumem(&with_report);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let shown: Vec<String> = html
        .split("data-field=\"allocated_bytes\" data-value=\"")
        .skip(1)
        .map(|cell| cell[..cell.find('"').unwrap()].to_string())
        .collect();
    let planned: Vec<String> = plan["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["allocated_bytes"].to_string())
        .collect();
    assert_eq!(shown, planned);
    if let Some(browser) = chromium() {
        let (charts, rects) = render_status(&browse(&browser, &page, "--dump-dom", &dir));
        assert_eq!(charts, 2, "the phases and the breakdown: {rects:?}");
    }
    let missing = dir.join("missing").join("plan.html");
    with_report.pop();
    with_report.push(missing.to_str().unwrap());
    let out = gpumem(&with_report);
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8(out.stderr).unwrap();
    assert!(
        message.contains("cannot write") && message.contains("missing"),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A snapshot PyTorch 2.15 wrote itself (`_profile_to_snapshot` of a CPU profile), whose
/// entries carry `frames` (profiler frames: `file(line): function` names).
const TORCH_SNAPSHOT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../gpumem-trace/tests/data/torch2.15.0_profile_to_snapshot.pickle"
);

/// Python (standard library only) reading the snapshot on its own: the number of block
/// events (`alloc`, `free_completed`, `free`) of device 0, and the frames of each of them, as
/// `[name, file, line]` with the profiler's `file(line): function` names split.
const FRAMES_BY_PYTHON: &str = r#"
import json, pickle, re, sys
snapshot = pickle.load(open(sys.argv[1], "rb"))
events = []
for entry in snapshot["device_traces"][0]:
    if entry["action"] in ("alloc", "free_completed", "free"):
        frames = []
        for frame in entry.get("frames") or []:
            m = re.fullmatch(r"(.*)\((\d+)\): (.*)", frame["name"])
            if frame["filename"] == "none" and m:
                frames.append([m[3], m[1], int(m[2])])
            else:
                frames.append([frame["name"], frame["filename"], frame["line"]])
        events.append(frames)
print(json.dumps(events))
"#;

/// `<code>NAME</code> <span class="place">FILE:LINE</span>` items of `html`, unescaped.
fn frames_shown(html: &str) -> Vec<(String, String, u64)> {
    let unescape = |text: &str| {
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#39;", "'")
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
    };
    html.split("<code>")
        .skip(1)
        .map(|item| {
            let name = &item[..item.find("</code>").unwrap()];
            let place_at = item.find("class=\"place\">").unwrap() + "class=\"place\">".len();
            let place = &item[place_at..place_at + item[place_at..].find('<').unwrap()];
            let (file, line) = place.rsplit_once(':').unwrap();
            (unescape(name), unescape(file), line.parse().unwrap())
        })
        .collect()
}

#[test]
fn the_oom_box_lists_the_failing_allocations_frames_from_a_pytorch_snapshot() {
    let Some(browser) = chromium() else {
        return;
    };
    let python = Command::new("python3")
        .args(["-c", FRAMES_BY_PYTHON, TORCH_SNAPSHOT])
        .output()
        .expect("python3 runs (the test scripts need it)");
    assert!(
        python.status.success(),
        "{}",
        String::from_utf8_lossy(&python.stderr)
    );
    let by_python: Vec<Vec<(String, String, u64)>> =
        serde_json::from_slice(&python.stdout).unwrap();

    let dir = scratch("frames");
    let page = dir.join("torch.html");
    // Above the peak live bytes (669 728), below what `none` rounds them to: it runs out of
    // memory late in the trace.
    let capacity = "670000";
    let args = [
        "report",
        TORCH_SNAPSHOT,
        "-o",
        page.to_str().unwrap(),
        "--capacity",
        capacity,
    ];
    let out = gpumem(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dom = browse(&browser, &page, "--dump-dom", &dir);
    render_status(&dom);

    let replay = json_of(&gpumem(&[
        "replay",
        TORCH_SNAPSHOT,
        "--capacity",
        capacity,
        "--json",
    ]));
    let none = &replay["policies"].as_array().unwrap()[0];
    assert_eq!(none["policy"], "none");
    let failing = none["oom"]["event_index"].as_u64().unwrap() as usize;
    // The reader puts the allocations made before recording first; the rest are the
    // snapshot's block events in order.
    let before_recording = replay["trace"]["events"].as_u64().unwrap() as usize - by_python.len();
    let recorded = &by_python[failing - before_recording];
    let user: Vec<(String, String, u64)> = recorded
        .iter()
        .filter(|frame| is_user(frame))
        .cloned()
        .collect();
    assert!(
        !user.is_empty() && user.len() < recorded.len(),
        "{recorded:?}"
    );

    let oom_at = dom
        .find("<div class=\"oom\" data-policy=\"none\">")
        .unwrap();
    let oom = &dom[oom_at..oom_at + dom[oom_at..].find("</div>").unwrap()];
    let list = &oom[oom.find("<ol class=\"frames\">").unwrap()..oom.find("</ol>").unwrap()];
    assert_eq!(frames_shown(list), user, "innermost user frame first");
    let hidden = attribute(oom, "data-field=\"hidden_frames\"", "data-value");
    assert_eq!(hidden, (recorded.len() - user.len()).to_string());

    // The largest live allocations are grouped by their innermost user frame.
    let table_at = dom.find("<table class=\"largest by-frame\">").unwrap();
    let table = &dom[table_at..table_at + dom[table_at..].find("</table>").unwrap()];
    let grouped = frames_shown(table);
    assert!(!grouped.is_empty());
    for frame in &grouped {
        assert!(
            by_python
                .iter()
                .any(|frames| frames.iter().find(|f| is_user(f)) == Some(frame)),
            "{frame:?} is some allocation's innermost user frame"
        );
    }
}

/// Whether a frame Python read is the user's: not in the `torch` package, not a built-in or
/// a profiler marker (no file).
fn is_user((name, file, _): &(String, String, u64)) -> bool {
    !file.starts_with("torch/") && file != "none" && !name.starts_with("nn.Module: ")
}

/// Writes a gpumem trace named `name` with `events` (JSON lines) into `dir`.
fn native_trace(dir: &Path, file: &str, name: &str, events: &[&str]) -> PathBuf {
    let path = dir.join(file);
    let header = serde_json::json!({"gpumem_trace": 1, "name": name, "source": "test"});
    std::fs::write(&path, format!("{header}\n{}\n", events.join("\n"))).unwrap();
    path
}

/// Writes the report of `args` (after `report`) to `dir/page`, checking that it succeeded.
fn report_page(dir: &Path, page: &str, args: &[&str]) -> (PathBuf, String) {
    let path = dir.join(page);
    let out = gpumem(&[&["report", "-o", path.to_str().unwrap()], args].concat());
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&path).unwrap();
    (path, html)
}

#[test]
fn odd_traces_draw_every_chart_with_distinct_tick_labels() {
    let Some(browser) = chromium() else {
        return;
    };
    let dir = scratch("odd");
    let alloc = "{\"op\": \"alloc\", \"addr\": 4096, \"size\": 512}";
    // A name that would hide the data's end tag from the HTML parser if written raw.
    let hiding = native_trace(&dir, "hiding.jsonl", "<!--<script>", &[alloc]);
    let zero = native_trace(
        &dir,
        "zero.jsonl",
        "zero",
        &[
            "{\"op\": \"alloc\", \"addr\": 4096, \"size\": 0}",
            "{\"op\": \"alloc\", \"addr\": 8192, \"size\": 0}",
        ],
    );
    let small = testdata(SMALL);
    let cases: [(&str, Vec<&str>); 3] = [
        ("hiding.html", vec![hiding.to_str().unwrap()]),
        ("zero.html", vec![zero.to_str().unwrap()]),
        ("small.html", vec![&small, "--capacity", "2GiB"]),
    ];
    for (page, args) in cases {
        let (path, _) = report_page(&dir, page, &args);
        let (charts, rects) = render_status(&browse(&browser, &path, "--dump-dom", &dir));
        assert_eq!(
            charts, 6,
            "{page}: a timeline, fragmentation, 4 maps: {rects:?}"
        );
        for rect in rects.iter().filter(|r| r["chart"] == "timeline") {
            let labels = |axis: &str| -> Vec<String> {
                let list = rect["ticks"][axis].as_array().unwrap();
                list.iter()
                    .map(|l| l.as_str().unwrap().to_string())
                    .collect()
            };
            let (x, y) = (labels("x"), labels("y"));
            assert!(x.len() >= 2 && y.len() >= 2, "{page}: {x:?} {y:?}");
            for axis in [&x, &y] {
                let mut distinct = axis.clone();
                distinct.dedup();
                assert_eq!(&distinct, axis, "{page}: every tick its own label");
            }
            assert!(
                x.iter().all(|l| l.replace(',', "").parse::<u64>().is_ok()),
                "{page}: event indices are whole: {x:?}"
            );
            let units: Vec<&str> = y.iter().filter_map(|l| l.split(' ').nth(1)).collect();
            assert!(
                units.windows(2).all(|w| w[0] == w[1]) && units.len() + 1 == y.len(),
                "{page}: one unit on the axis: {y:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_page_shows_what_the_reader_skipped_and_the_settings_in_force() {
    let dir = scratch("notes");
    let csv = dir.join("rmm.csv");
    std::fs::write(
        &csv,
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,10:00:00.000000,allocate,0x7f0000001000,1048576,0\n\
         1,10:00:00.000001,allocate failure,0x0,99999999999,0\n\
         1,10:00:00.000002,allocate,(nil),0,0\n\
         1,10:00:00.000003,free,0x7f0000001000,1048576,0\n",
    )
    .unwrap();
    let csv = csv.to_str().unwrap();
    let replay = json_of(&gpumem(&["replay", csv, "--json"]));
    let notes = replay["trace"]["skipped"].as_array().unwrap();
    assert_eq!(notes.len(), 2, "{notes:?}");
    let (_, html) = report_page(&dir, "rmm.html", &[csv]);
    let shown: Vec<&str> = html
        .split("data-field=\"skipped\">")
        .skip(1)
        .map(|p| &p[..p.find("</p>").unwrap()])
        .collect();
    let expected: Vec<String> = notes
        .iter()
        .map(|n| {
            let n = n.as_str().unwrap();
            n.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('\'', "&#39;")
        })
        .collect();
    assert_eq!(shown, expected);
    assert!(
        html.contains("Settings: PyTorch&#39;s defaults."),
        "defaults said"
    );

    let small = testdata(SMALL);
    let (_, html) = report_page(
        &dir,
        "conf.html",
        &[
            &small,
            "--pytorch-alloc-conf",
            "max_split_size_mb:20",
            "--gpumem-policy-conf",
            "stitch_hole_divisor:8",
        ],
    );
    let header = &html[html.find("<header>").unwrap()..html.find("</header>").unwrap()];
    assert!(
        header.contains("PyTorch allocator expandable_segments:False,max_split_size_mb:20")
            && header.contains("gpumem policy stitch_hole_divisor:8"),
        "{header}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
