//! Two pictures of a run, as SVG (no dependency: a bar chart is a few rectangles):
//!
//! - `compare-latency.svg`: acquire+release with one task on five healthy nodes, p50 and p99
//!   per implementation and runtime: quorumlock beside the floor and the peers.
//! - `compare-handover.svg`: one key, eight tasks waiting: how long from a release to the next
//!   holder (p50 and p99) per implementation and runtime.
//!
//! Written next to the generated table (`docs/img/` when the tool rewrites
//! `docs/benchmarks.md`), so the README can link them. Same run, same slices as the table.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::report::{Phase, Row};

/// One bar pair: a label, its p50 and p99.
struct Bar {
    label: String,
    p50: f64,
    p99: f64,
    ours: bool,
}

const WIDTH: f64 = 760.0;
const LEFT: f64 = 260.0;
const RIGHT: f64 = 90.0;
const ROW: f64 = 26.0;
const TOP: f64 = 56.0;

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn label(row: &Row) -> String {
    format!("{} ({})", row.imp, row.rt.label(&row.imp))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A horizontal bar chart: per bar, p50 solid and p99 as a lighter bar behind it.
fn chart(title: &str, unit: &str, bars: &[Bar]) -> String {
    let height = TOP + ROW * bars.len() as f64 + 40.0;
    let max = bars.iter().map(|b| b.p99.max(b.p50)).fold(1.0, f64::max);
    let scale = (WIDTH - LEFT - RIGHT) / max;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{x}" y="22" font-size="15" font-weight="bold">{title}</text>
<text x="{x}" y="40" fill="#555555">dark: p50, light: p99 ({unit}); quorumlock in blue; one run, the implementations taking turns</text>
"##,
        x = 10,
        title = escape(title),
    );
    for (i, b) in bars.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let (dark, light) = if b.ours {
            ("#1f5fa8", "#a9c4e6")
        } else {
            ("#555555", "#cccccc")
        };
        let _ = write!(
            svg,
            r##"<text x="{lx}" y="{ty}" text-anchor="end"{bold}>{label}</text>
<rect x="{LEFT}" y="{y}" width="{w99:.1}" height="18" fill="{light}"/>
<rect x="{LEFT}" y="{y}" width="{w50:.1}" height="18" fill="{dark}"/>
<text x="{vx:.1}" y="{ty}" fill="#333333">{p50:.0} / {p99:.0}</text>
"##,
            lx = LEFT - 8.0,
            ty = y + 13.0,
            bold = if b.ours { r#" font-weight="bold""# } else { "" },
            label = escape(&b.label),
            w99 = b.p99 * scale,
            w50 = b.p50 * scale,
            vx = LEFT + b.p99.max(b.p50) * scale + 6.0,
            p50 = b.p50,
            p99 = b.p99,
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn bars(rows: &[Row], scenario: &str, pick: impl Fn(&Row, f64) -> Option<Duration>) -> Vec<Bar> {
    rows.iter()
        .filter(|r| r.phase == Phase::Healthy && r.scenario == scenario)
        .filter_map(|r| {
            Some(Bar {
                label: label(r),
                p50: us(pick(r, 0.50)?),
                p99: us(pick(r, 0.99)?),
                ours: r.imp.starts_with("quorumlock"),
            })
        })
        .collect()
}

/// Writes the two charts into `dir` (created if missing); a chart with no data is skipped.
pub(crate) fn write(rows: &[Row], dir: &Path) -> std::io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let latency = bars(rows, "acquire+release, 1 task", Row::latency);
    if !latency.is_empty() {
        let path = dir.join("compare-latency.svg");
        std::fs::write(
            &path,
            chart("acquire + release, 1 task, 5 healthy nodes", "µs", &latency),
        )?;
        written.push(path.display().to_string());
    }
    let handover = bars(rows, "one key, 8 tasks waiting", Row::handover);
    if !handover.is_empty() {
        let path = dir.join("compare-handover.svg");
        std::fs::write(
            &path,
            chart(
                "handover: a release to the next holder, one key, 8 tasks waiting",
                "µs",
                &handover,
            ),
        )?;
        written.push(path.display().to_string());
    }
    Ok(written)
}
