//! `--report DIR`: the run's report as JSON beside an HTML page with plots
//! people can look at (SVG, drawn here: no plotting library, no network):
//! the lateness histogram, delivery rate over time against the rate the
//! events came due, and lateness over time.
//!
//! The deliveries are the last ones analysed ([`remember`], called where
//! arrivals are summarised), so every scenario that delivers gets plots.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;

/// `(scheduled_ms, arrived_ms)` of each event's first delivery, from the
/// last analysis.
static ARRIVALS: Mutex<Vec<(i64, i64)>> = Mutex::new(Vec::new());

/// Keeps the first deliveries of the latest analysis for the plots.
pub(crate) fn remember(arrivals: impl Iterator<Item = (i64, i64)>) {
    let mut kept = ARRIVALS.lock().unwrap_or_else(|e| e.into_inner());
    kept.clear();
    kept.extend(arrivals);
}

/// Writes `report.json` and `report.html` (and the plots as `.svg` files)
/// into `dir`.
///
/// # Errors
/// When the directory or a file cannot be written.
pub fn write(dir: &Path, json: &str, table: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let arrivals = ARRIVALS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let plots = [
        ("lateness-histogram.svg", lateness_histogram(&arrivals)),
        ("rate-over-time.svg", rate_over_time(&arrivals)),
        ("lateness-over-time.svg", lateness_over_time(&arrivals)),
    ];
    let mut html = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>belfry-bench report</title>\
         <style>body{font-family:sans-serif;margin:2em;color:#222}pre{background:#f4f4f4;padding:1em}\
         svg{display:block;margin:1em 0}</style></head><body><h1>belfry-bench report</h1>",
    );
    let _ = write!(html, "<pre>{}</pre>", escape(table));
    for (name, svg) in &plots {
        std::fs::write(dir.join(name), svg).with_context(|| format!("write {name}"))?;
        html.push_str(svg);
    }
    html.push_str("<p>Raw report: <a href=\"report.json\">report.json</a></p></body></html>");
    std::fs::write(dir.join("report.json"), json).context("write report.json")?;
    std::fs::write(dir.join("report.html"), html).context("write report.html")?;
    Ok(())
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 300.0;
const LEFT: f64 = 70.0;
const BOTTOM: f64 = 40.0;
const TOP: f64 = 30.0;

/// An empty chart with a title, axis labels and `ticks` on the y axis.
fn frame(title: &str, x_label: &str, y_label: &str, y_max: f64) -> String {
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <text x=\"{LEFT}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\
         <text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>",
        escape(title),
        LEFT + (WIDTH - LEFT - 10.0) / 2.0,
        HEIGHT - 6.0,
        escape(x_label),
        HEIGHT / 2.0,
        HEIGHT / 2.0,
        escape(y_label)
    );
    for step in 0..=4 {
        let value = y_max * f64::from(step) / 4.0;
        let y = y_of(value, y_max);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - 10.0,
            LEFT - 6.0,
            y + 4.0,
            short(value)
        );
    }
    svg
}

fn y_of(value: f64, y_max: f64) -> f64 {
    let plot_height = HEIGHT - TOP - BOTTOM;
    HEIGHT - BOTTOM - plot_height * (value / y_max.max(f64::MIN_POSITIVE))
}

fn short(value: f64) -> String {
    if value >= 1_000_000.0 {
        format!("{:.1}M", value / 1_000_000.0)
    } else if value >= 10_000.0 {
        format!("{:.0}k", value / 1_000.0)
    } else if value >= 10.0 || value == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// Lateness bucket upper bounds in ms (the last bucket is open).
const BUCKETS_MS: &[i64] = &[
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000,
];

fn lateness_histogram(arrivals: &[(i64, i64)]) -> String {
    let mut counts = vec![0u64; BUCKETS_MS.len() + 1];
    let mut early = 0u64;
    for (scheduled, arrived) in arrivals {
        let lateness = arrived - scheduled;
        if lateness < 0 {
            early += 1;
            continue;
        }
        let bucket = BUCKETS_MS
            .iter()
            .position(|bound| lateness < *bound)
            .unwrap_or(BUCKETS_MS.len());
        counts[bucket] += 1;
    }
    let y_max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let title = format!(
        "Lateness of {} first deliveries (arrival − instant){}",
        arrivals.len(),
        if early > 0 {
            format!(", {early} EARLY")
        } else {
            String::new()
        }
    );
    let mut svg = frame(
        &title,
        "lateness (ms, bucket upper bound)",
        "deliveries",
        y_max,
    );
    let slot = (WIDTH - LEFT - 10.0) / counts.len() as f64;
    for (i, count) in counts.iter().enumerate() {
        let x = LEFT + slot * i as f64;
        let y = y_of(*count as f64, y_max);
        let label = BUCKETS_MS
            .get(i)
            .map_or_else(|| "more".to_string(), |b| format!("<{}", short(*b as f64)));
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#4a7fb5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            x + 2.0,
            slot - 4.0,
            HEIGHT - BOTTOM - y,
            x + slot / 2.0,
            HEIGHT - BOTTOM + 14.0
        );
        if *count > 0 {
            let _ = write!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{count}</text>",
                x + slot / 2.0,
                y - 3.0
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// Time bins over the run: `(start_ms, width_ms, count)`.
fn bins(arrivals: &[(i64, i64)]) -> Option<(i64, i64, usize)> {
    let start = arrivals.iter().map(|(s, _)| *s).min()?;
    let end = arrivals
        .iter()
        .map(|(s, a)| (*s).max(*a))
        .max()?
        .max(start + 1);
    let width = ((end - start) / 150).max(100);
    let count = usize::try_from((end - start) / width + 1).unwrap_or(1);
    Some((start, width, count))
}

/// A polyline through `values` (one per bin), in `colour`.
fn line(values: &[f64], y_max: f64, colour: &str) -> String {
    let slot = (WIDTH - LEFT - 10.0) / values.len().max(1) as f64;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                LEFT + slot * (i as f64 + 0.5),
                y_of(*v, y_max)
            )
        })
        .collect();
    format!(
        "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
        points.join(" ")
    )
}

fn x_axis(svg: &mut String, width_ms: i64, bins: usize) {
    let seconds = (width_ms as f64 * bins as f64) / 1000.0;
    for step in 0..=4 {
        let x = LEFT + (WIDTH - LEFT - 10.0) * f64::from(step) / 4.0;
        let _ = write!(
            svg,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            HEIGHT - BOTTOM + 14.0,
            short(seconds * f64::from(step) / 4.0)
        );
    }
}

fn legend(svg: &mut String, entries: &[(&str, &str)]) {
    for (i, (colour, text)) in entries.iter().enumerate() {
        let x = WIDTH - 230.0;
        let y = TOP + 14.0 * i as f64;
        let _ = write!(
            svg,
            "<rect x=\"{x}\" y=\"{:.1}\" width=\"10\" height=\"3\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{text}</text>",
            y - 4.0,
            x + 14.0,
            y
        );
    }
}

fn rate_over_time(arrivals: &[(i64, i64)]) -> String {
    let Some((start, width, count)) = bins(arrivals) else {
        return empty("Delivery rate over time");
    };
    let mut due = vec![0.0; count];
    let mut delivered = vec![0.0; count];
    let per_second = 1000.0 / width as f64;
    for (scheduled, arrived) in arrivals {
        let bin = |t: i64| {
            usize::try_from((t - start) / width)
                .unwrap_or(0)
                .min(count - 1)
        };
        due[bin(*scheduled)] += per_second;
        delivered[bin(*arrived)] += per_second;
    }
    let y_max = due.iter().chain(&delivered).copied().fold(1.0, f64::max);
    let mut svg = frame(
        "Events coming due and delivered per second",
        "seconds since the first instant",
        "events/s",
        y_max * 1.05,
    );
    svg.push_str(&line(&due, y_max * 1.05, "#999"));
    svg.push_str(&line(&delivered, y_max * 1.05, "#c0392b"));
    x_axis(&mut svg, width, count);
    legend(
        &mut svg,
        &[
            ("#999", "coming due"),
            ("#c0392b", "delivered (first copy)"),
        ],
    );
    svg.push_str("</svg>");
    svg
}

fn lateness_over_time(arrivals: &[(i64, i64)]) -> String {
    let Some((start, width, count)) = bins(arrivals) else {
        return empty("Lateness over time");
    };
    let mut per_bin: Vec<Vec<i64>> = vec![Vec::new(); count];
    for (scheduled, arrived) in arrivals {
        let bin = usize::try_from((scheduled - start) / width)
            .unwrap_or(0)
            .min(count - 1);
        per_bin[bin].push(arrived - scheduled);
    }
    let mut p50 = Vec::with_capacity(count);
    let mut max = Vec::with_capacity(count);
    for values in &mut per_bin {
        values.sort_unstable();
        p50.push(values.get(values.len() / 2).copied().unwrap_or(0) as f64);
        max.push(values.last().copied().unwrap_or(0) as f64);
    }
    let y_max = max.iter().copied().fold(1.0, f64::max) * 1.05;
    let mut svg = frame(
        "Lateness by instant (ms)",
        "instant, seconds since the first",
        "lateness (ms)",
        y_max,
    );
    svg.push_str(&line(&max, y_max, "#c0392b"));
    svg.push_str(&line(&p50, y_max, "#4a7fb5"));
    x_axis(&mut svg, width, count);
    legend(&mut svg, &[("#c0392b", "max"), ("#4a7fb5", "median")]);
    svg.push_str("</svg>");
    svg
}

fn empty(title: &str) -> String {
    let mut svg = frame(title, "", "", 1.0);
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no deliveries in this run</text></svg>",
        WIDTH / 2.0,
        HEIGHT / 2.0
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_svg_with_one_bar_per_bucket_and_flag_early_ones() {
        let arrivals: Vec<(i64, i64)> = (0..1000)
            .map(|i| (1_000 + i, 1_000 + i + (i % 7)))
            .chain([(5_000, 4_999)])
            .collect();
        let histogram = lateness_histogram(&arrivals);
        assert!(histogram.starts_with("<svg") && histogram.ends_with("</svg>"));
        assert_eq!(
            histogram.matches("fill=\"#4a7fb5\"").count(),
            BUCKETS_MS.len() + 1
        );
        assert!(histogram.contains("1 EARLY"), "{histogram}");
        let rate = rate_over_time(&arrivals);
        assert_eq!(rate.matches("<polyline").count(), 2);
        assert!(lateness_over_time(&[]).contains("no deliveries"));
    }

    #[test]
    fn the_report_directory_gets_json_html_and_svg() {
        remember([(1_000, 1_003), (1_001, 1_010)].into_iter());
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "{\"scenario\":\"x\"}", "scenario  x <&>").unwrap();
        let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
        assert!(html.contains("scenario  x &lt;&amp;&gt;"));
        assert_eq!(html.matches("<svg").count(), 3);
        for name in [
            "report.json",
            "lateness-histogram.svg",
            "rate-over-time.svg",
        ] {
            assert!(dir.path().join(name).is_file(), "{name}");
        }
    }
}
