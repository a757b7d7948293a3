//! The web console at `GET /ui`: a few static files (plain ES modules and
//! CSS, no build step) compiled into the binary and served as they are.
//!
//! The files are public: they hold no data. The page asks for an API key
//! (kept in the tab's `sessionStorage`), and everything it shows comes from
//! the JSON API with that key, so the route table and the roles apply to
//! the console exactly as to any client. The console is hash-routed
//! (`/ui#/events?tenant=…`): one HTML page, one set of modules.
//!
//! Every answer carries a strict Content-Security-Policy (scripts, styles
//! and connections only from this origin, no inline script, no framing),
//! `nosniff`, and an `ETag` with `Cache-Control: no-cache`, so a browser
//! revalidates (a `304`, no body) and never runs modules of an older
//! binary.
//!
//! # Layout
//! - `assets/index.html`, `assets/console.css`, `assets/favicon.svg`;
//! - `assets/app.js`: the shell (sign-in, navigation, hash router);
//! - `assets/api.js` (fetch with the key), `dom.js` (DOM building, tables,
//!   formatting), `chart.js` (SVG line charts), `prom.js` (Prometheus text
//!   parsing, rates and quantiles);
//! - `assets/page-*.js`: one module per page.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, Code};

/// Where the console is served.
const PREFIX: &str = "/ui";

/// Whether `path` is the console's page or one of its files.
pub(crate) fn is_console_path(path: &str) -> bool {
    path == PREFIX
        || path
            .strip_prefix(PREFIX)
            .is_some_and(|r| r.starts_with('/'))
}

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("assets/", $name)),
        }
    };
}

/// Every file of the console; the first is the page itself.
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("console.css", CSS),
    asset!("favicon.svg", SVG),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("chart.js", JS),
    asset!("prom.js", JS),
    asset!("page-overview.js", JS),
    asset!("page-tenants.js", JS),
    asset!("page-events.js", JS),
    asset!("page-schedules.js", JS),
    asset!("page-dead.js", JS),
    asset!("page-bulk.js", JS),
    asset!("page-cluster.js", JS),
    asset!("page-audit.js", JS),
];

/// Scripts, styles, images and API calls from this origin only; no inline
/// script or style element, no plugins, no framing, forms post nowhere.
/// (Styles set through the CSSOM, as progress bars do, are not inline
/// styles to CSP.)
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The `ETag` of each asset (in [`ASSETS`] order): a hash of its bytes,
/// so it changes exactly when a new binary serves other files.
fn etags() -> &'static [String] {
    static ETAGS: OnceLock<Vec<String>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|asset| {
                let mut hasher = DefaultHasher::new();
                asset.body.hash(&mut hasher);
                format!("\"{:016x}\"", hasher.finish())
            })
            .collect()
    })
}

/// The page's other address, left out of the OpenAPI document.
pub(crate) const PAGE_WITH_SLASH: &str = "/ui/";

/// The console's page.
#[utoipa::path(
    get,
    path = PREFIX,
    tag = "console",
    operation_id = "console_page",
    summary = "The web console (HTML; no key needed to load it, see docs/console.md)",
    security(()),
    responses(
        (status = 200, description = "The console's page", body = String, content_type = "text/html"),
        (status = 304, description = "Not modified (If-None-Match)")
    )
)]
pub(crate) async fn page(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

/// One of the console's files (scripts, styles, icon).
#[utoipa::path(
    get,
    path = "/ui/{asset}",
    tag = "console",
    operation_id = "console_asset",
    summary = "A file of the web console",
    security(()),
    params(("asset" = String, Path, description = "File name, e.g. app.js")),
    responses(
        (status = 200, description = "The file", content(
            (String = "text/javascript"),
            (String = "text/css"),
            (String = "text/html"),
            (String = "image/svg+xml"),
        )),
        (status = 304, description = "Not modified (If-None-Match)"),
        (status = 404, description = "No such file", body = crate::openapi::schema::BigBenError)
    )
)]
pub(crate) async fn file(uri: Uri, headers: HeaderMap) -> Response {
    // The raw last segment: file names need no decoding, and anything
    // encoded is no file name.
    let name = uri.path().rsplit('/').next().unwrap_or_default();
    match ASSETS.iter().position(|asset| asset.name == name) {
        Some(index) => serve(index, &headers),
        None => with_security_headers(
            crate::error::BigBenError(ApiError::new(
                Code::NotFound,
                format!("the console has no file {name:?}"),
            ))
            .into_response(),
        ),
    }
}

/// Answers asset `index`, or `304` when the browser holds this version.
fn serve(index: usize, headers: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    let etag = &etags()[index];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.body,
        )
            .into_response()
    };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_security_headers(response)
}

fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_paths_are_the_prefix_and_below_only() {
        assert!(is_console_path("/ui"));
        assert!(is_console_path("/ui/"));
        assert!(is_console_path("/ui/app.js"));
        assert!(!is_console_path("/uix"));
        assert!(!is_console_path("/v1/ui"));
    }

    #[test]
    fn asset_names_are_unique_and_typed_by_extension() {
        let mut names: Vec<&str> = ASSETS.iter().map(|a| a.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ASSETS.len());
        for asset in ASSETS {
            let expected = match asset.name.rsplit('.').next() {
                Some("html") => HTML,
                Some("css") => CSS,
                Some("js") => JS,
                Some("svg") => SVG,
                other => panic!("unexpected extension {other:?}"),
            };
            assert_eq!(asset.content_type, expected, "{}", asset.name);
            assert!(!asset.body.is_empty(), "{}", asset.name);
        }
        assert_eq!(ASSETS[0].name, "index.html");
    }

    #[test]
    fn every_file_of_the_assets_folder_is_served_and_every_import_exists() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/console/assets");
        let mut on_disk: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        on_disk.sort_unstable();
        let mut served: Vec<&str> = ASSETS.iter().map(|a| a.name).collect();
        served.sort_unstable();
        assert_eq!(on_disk, served);
        for asset in ASSETS.iter().filter(|a| a.content_type == JS) {
            let text = std::str::from_utf8(asset.body).unwrap();
            for import in text.split("from './").skip(1) {
                let name = import.split('\'').next().unwrap();
                assert!(
                    ASSETS.iter().any(|a| a.name == name),
                    "{} imports {name}, which is not served",
                    asset.name
                );
            }
            // Data becomes text, never markup.
            assert!(!text.contains("innerHTML"), "{}", asset.name);
        }
    }
}
