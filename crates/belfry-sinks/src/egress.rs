//! The egress policy: which addresses a delivery may connect to.
//!
//! Checked on the address actually connected to — in the resolver of both
//! webhook transports, after DNS, so a host name that resolves to a
//! forbidden address is refused as surely as the literal address — after
//! mapping IPv4-mapped (`::ffff:a.b.c.d`) and NAT64 (`64:ff9b::a.b.c.d`)
//! IPv6 addresses back to IPv4.
//!
//! # The rules, in order
//! 1. An address in `egress.deny` is refused.
//! 2. An address in `egress.allow` is allowed (this is the only way to
//!    reach an always-refused range).
//! 3. Always refused: unspecified (`0.0.0.0/8`, `::`), link-local
//!    (`169.254.0.0/16`, `fe80::/10`) and with it the cloud metadata
//!    endpoints (`169.254.169.254`, `fd00:ec2::254`), multicast
//!    (`224.0.0.0/4`, `ff00::/8`), broadcast and reserved (`240.0.0.0/4`),
//!    documentation (`192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`,
//!    `2001:db8::/32`), benchmarking (`198.18.0.0/15`), IETF protocol
//!    assignments (`192.0.0.0/24`), discard-only (`100::/64`), deprecated
//!    site-local (`fec0::/10`) and IPv4-compatible (`::/96`) addresses.
//! 4. Loopback (`127.0.0.0/8`, `::1`) and private (`10.0.0.0/8`,
//!    `172.16.0.0/12`, `192.168.0.0/16`, shared `100.64.0.0/10`, unique
//!    local `fc00::/7`) addresses follow `egress.policy`: refused under
//!    `auto` (the default) except loopback while the node runs open (no
//!    API keys, a loopback listener: its operator is its only user),
//!    refused under `public-only`, allowed under `internal` (a BigBen
//!    drop-in calling services on the company network, chosen
//!    explicitly).
//! 5. Everything else (public unicast) is allowed.
//!
//! A refusal is a permanent failure of the delivery, recorded with the
//! code `egress_blocked` at the start of the attempt's error.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use belfry_core::config::ConfigKeys;
use serde::{Deserialize, Serialize};

/// The stable code at the start of a refused attempt's error.
pub const EGRESS_BLOCKED: &str = "egress_blocked";

/// What loopback and private addresses get.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EgressMode {
    /// Like `public-only`, except that loopback is allowed while the node
    /// runs open ([`EgressPolicy::set_open`]): tenants are less trusted
    /// than the operator once keys exist.
    #[default]
    Auto,
    /// Loopback and private addresses are allowed.
    Internal,
    /// Only public addresses (and `egress.allow`) are allowed.
    PublicOnly,
}

impl EgressMode {
    /// The name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            EgressMode::Auto => "auto",
            EgressMode::Internal => "internal",
            EgressMode::PublicOnly => "public-only",
        }
    }
}

/// The node's egress settings (config section `egress`). Each field's doc
/// comment is the user reference.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct EgressOptions {
    /// Which addresses webhooks may reach: `auto` refuses loopback and
    /// private addresses, except loopback while the node runs open (no API
    /// keys, loopback listener: the tour); `public-only` refuses them
    /// always; `internal` allows them (a BigBen drop-in calling services on
    /// its network: set it explicitly). Link-local, cloud metadata,
    /// multicast, broadcast and reserved addresses are always refused, and
    /// a URL whose host is a refused address is a 400 at registration
    /// (`docs/security.md`).
    pub policy: EgressMode,
    /// CIDR blocks webhooks may always reach (`["10.20.0.0/16"]`,
    /// `fd00::/8`, or one address), even inside an always-refused range;
    /// `egress.deny` wins.
    pub allow: Vec<Cidr>,
    /// CIDR blocks webhooks may never reach (wins over `egress.allow`).
    pub deny: Vec<Cidr>,
}

impl EgressOptions {
    /// `policy = "internal"`, no lists: for callers that are the operator
    /// (tests, examples, a BigBen drop-in).
    pub fn internal() -> Self {
        EgressOptions {
            policy: EgressMode::Internal,
            ..EgressOptions::default()
        }
    }
}

/// An address block: an address and a prefix length.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// # Errors
    /// A prefix longer than the address.
    pub fn new(network: IpAddr, prefix: u8) -> Result<Self, String> {
        let bits = match network {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > bits {
            return Err(format!("prefix /{prefix} is longer than {bits} bits"));
        }
        Ok(Cidr { network, prefix })
    }

    /// Whether `ip` is inside the block (an IPv4 block never holds an IPv6
    /// address: map first).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_match(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                self.prefix,
                32,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_match(net.to_bits(), ip.to_bits(), self.prefix, 128)
            }
            _ => false,
        }
    }
}

fn prefix_match(network: u128, ip: u128, prefix: u8, bits: u32) -> bool {
    let prefix = u32::from(prefix);
    if prefix == 0 {
        return true;
    }
    let shift = bits - prefix;
    (network >> shift) == (ip >> shift)
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or CIDR block"))?;
        let prefix = match prefix {
            Some(prefix) => prefix
                .trim()
                .parse()
                .map_err(|_| format!("{text:?} has an invalid prefix length"))?,
            None if network.is_ipv4() => 32,
            None => 128,
        };
        Cidr::new(network, prefix).map_err(|e| format!("{text:?}: {e}"))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{EGRESS_BLOCKED}: {address} is {reason}{}", .policy.map(|p| format!(" (egress.policy is {})", p.as_str())).unwrap_or_default())]
pub struct EgressRefusal {
    /// The address as checked (after mapping to IPv4).
    pub address: IpAddr,
    pub reason: &'static str,
    /// The policy that refused an internal address; `None` for the
    /// always-refused ranges and `egress.deny`.
    pub policy: Option<EgressMode>,
}

/// The class of an address, for the rules above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Refused unless allowed; the reason.
    Forbidden(&'static str),
    /// Follows the policy; the reason when refused.
    Internal(&'static str),
    Public,
}

/// The options, ready to check addresses.
#[derive(Debug, Default)]
pub struct EgressPolicy {
    options: EgressOptions,
    /// Under `auto`: whether the node runs open, so loopback is allowed.
    /// Off until the node says so; once keys exist it goes off for good.
    open: AtomicBool,
}

impl EgressPolicy {
    pub fn new(options: EgressOptions) -> Self {
        EgressPolicy {
            options,
            open: AtomicBool::new(false),
        }
    }

    pub fn options(&self) -> &EgressOptions {
        &self.options
    }

    /// Whether the node runs open (no API keys, a loopback listener): under
    /// `auto`, loopback is allowed only then.
    pub fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Release);
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Whether a URL's host is always refused, as far as registration can
    /// tell: an address literal (in any spelling the URL parser reads as
    /// one) checked like a connection's, and `localhost` names (always
    /// loopback, RFC 6761) checked as `127.0.0.1`. Other names are checked
    /// at every delivery, after DNS.
    ///
    /// # Errors
    /// The refusal, naming the address.
    pub fn check_host(&self, host: &url::Host<&str>) -> Result<(), EgressRefusal> {
        match host {
            url::Host::Ipv4(ip) => self.check(IpAddr::V4(*ip)),
            url::Host::Ipv6(ip) => self.check(IpAddr::V6(*ip)),
            url::Host::Domain(name) => {
                let name = name.strip_suffix('.').unwrap_or(name);
                if name == "localhost" || name.ends_with(".localhost") {
                    self.check(IpAddr::V4(Ipv4Addr::LOCALHOST))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Whether a delivery may connect to `address`.
    ///
    /// # Errors
    /// The refusal, naming the (mapped) address and its range.
    pub fn check(&self, address: IpAddr) -> Result<(), EgressRefusal> {
        let address = canonical(address);
        let refuse = |reason, policy| {
            Err(EgressRefusal {
                address,
                reason,
                policy,
            })
        };
        if self.options.deny.iter().any(|cidr| cidr.contains(address)) {
            return refuse("in egress.deny", None);
        }
        if self.options.allow.iter().any(|cidr| cidr.contains(address)) {
            return Ok(());
        }
        match classify(address) {
            Class::Forbidden(reason) => refuse(reason, None),
            Class::Internal(reason) => match self.options.policy {
                EgressMode::Internal => Ok(()),
                EgressMode::Auto if address.is_loopback() && self.is_open() => Ok(()),
                policy => refuse(reason, Some(policy)),
            },
            Class::Public => Ok(()),
        }
    }
}

/// IPv4-mapped (`::ffff:0:0/96`) and NAT64 well-known-prefix
/// (`64:ff9b::/96`) addresses as the IPv4 address they reach.
pub fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let bits = v6.to_bits();
            if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
                // Truncation intended: the low 32 bits are the address.
                return IpAddr::V4(Ipv4Addr::from_bits(bits as u32));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

fn in_v4(ip: Ipv4Addr, network: [u8; 4], prefix: u8) -> bool {
    prefix_match(
        u128::from(ip.to_bits()),
        u128::from(Ipv4Addr::from(network).to_bits()),
        prefix,
        32,
    )
}

fn in_v6(ip: Ipv6Addr, network: u128, prefix: u8) -> bool {
    prefix_match(ip.to_bits(), network, prefix, 128)
}

fn classify(address: IpAddr) -> Class {
    match address {
        IpAddr::V4(ip) => classify_v4(ip),
        IpAddr::V6(ip) => classify_v6(ip),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    const FORBIDDEN: &[([u8; 4], u8, &str)] = &[
        ([169, 254, 169, 254], 32, "a cloud metadata address"),
        ([0, 0, 0, 0], 8, "unspecified (0.0.0.0/8)"),
        ([169, 254, 0, 0], 16, "link-local (169.254.0.0/16)"),
        ([255, 255, 255, 255], 32, "broadcast"),
        ([224, 0, 0, 0], 4, "multicast (224.0.0.0/4)"),
        ([240, 0, 0, 0], 4, "reserved (240.0.0.0/4)"),
        (
            [192, 0, 0, 0],
            24,
            "reserved for IETF protocols (192.0.0.0/24)",
        ),
        ([192, 0, 2, 0], 24, "a documentation address (192.0.2.0/24)"),
        (
            [198, 51, 100, 0],
            24,
            "a documentation address (198.51.100.0/24)",
        ),
        (
            [203, 0, 113, 0],
            24,
            "a documentation address (203.0.113.0/24)",
        ),
        (
            [198, 18, 0, 0],
            15,
            "reserved for benchmarking (198.18.0.0/15)",
        ),
    ];
    const INTERNAL: &[([u8; 4], u8, &str)] = &[
        ([127, 0, 0, 0], 8, "loopback"),
        ([10, 0, 0, 0], 8, "private"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 168, 0, 0], 16, "private"),
        ([100, 64, 0, 0], 10, "shared address space"),
    ];
    if let Some((_, _, reason)) = FORBIDDEN.iter().find(|(n, p, _)| in_v4(ip, *n, *p)) {
        return Class::Forbidden(reason);
    }
    if let Some((_, _, reason)) = INTERNAL.iter().find(|(n, p, _)| in_v4(ip, *n, *p)) {
        return Class::Internal(reason);
    }
    Class::Public
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    const FORBIDDEN: &[(u128, u8, &str)] = &[
        (
            0xfd00_0ec2_0000_0000_0000_0000_0000_0254,
            128,
            "a cloud metadata address",
        ),
        (0, 128, "unspecified (::)"),
        (0xfe80 << 112, 10, "link-local (fe80::/10)"),
        (0xff00 << 112, 8, "multicast (ff00::/8)"),
        (
            0x2001_0db8 << 96,
            32,
            "a documentation address (2001:db8::/32)",
        ),
        (0x0100 << 112, 64, "discard-only (100::/64)"),
        (0xfec0 << 112, 10, "deprecated site-local (fec0::/10)"),
    ];
    if ip == Ipv6Addr::LOCALHOST {
        return Class::Internal("loopback");
    }
    if let Some((_, _, reason)) = FORBIDDEN.iter().find(|(n, p, _)| in_v6(ip, *n, *p)) {
        return Class::Forbidden(reason);
    }
    // `::a.b.c.d` (IPv4-compatible, deprecated); `::` and `::1` are
    // handled above.
    if in_v6(ip, 0, 96) {
        return Class::Forbidden("reserved (IPv4-compatible ::/96)");
    }
    if in_v6(ip, 0xfc00 << 112, 7) {
        return Class::Internal("unique local");
    }
    Class::Public
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: EgressMode, allow: &[&str], deny: &[&str]) -> EgressPolicy {
        EgressPolicy::new(EgressOptions {
            policy: mode,
            allow: allow.iter().map(|c| c.parse().unwrap()).collect(),
            deny: deny.iter().map(|c| c.parse().unwrap()).collect(),
        })
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    const ALWAYS_REFUSED: &[&str] = &[
        "169.254.169.254",
        "169.254.1.1",
        "fe80::1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "fd00:ec2::254",
        "0.0.0.0",
        "0.1.2.3",
        "::",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "255.255.255.255",
        "240.0.0.1",
        "192.0.2.7",
        "198.51.100.1",
        "203.0.113.9",
        "2001:db8::1",
        "198.18.0.1",
        "192.0.0.8",
        "100::1",
        "fec0::1",
        "::7f00:1",
    ];
    const INTERNAL: &[&str] = &[
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "::ffff:127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "fc00::1",
        "fd12:3456::1",
    ];
    const PUBLIC: &[&str] = &[
        "8.8.8.8",
        "1.1.1.1",
        "172.32.0.1",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
    ];

    #[test]
    fn ranges_under_both_policies() {
        let internal = policy(EgressMode::Internal, &[], &[]);
        let public_only = policy(EgressMode::PublicOnly, &[], &[]);
        for address in ALWAYS_REFUSED {
            for p in [&internal, &public_only] {
                let refusal = p.check(ip(address)).unwrap_err();
                assert!(
                    refusal.to_string().starts_with("egress_blocked: "),
                    "{refusal}"
                );
            }
        }
        for address in INTERNAL {
            assert_eq!(internal.check(ip(address)), Ok(()), "{address}");
            assert!(public_only.check(ip(address)).is_err(), "{address}");
        }
        for address in PUBLIC {
            assert_eq!(internal.check(ip(address)), Ok(()), "{address}");
            assert_eq!(public_only.check(ip(address)), Ok(()), "{address}");
        }
    }

    #[test]
    fn auto_refuses_internal_addresses_and_allows_loopback_only_while_open() {
        let auto = EgressPolicy::default();
        for address in INTERNAL {
            let refusal = auto.check(ip(address)).unwrap_err();
            assert!(
                refusal.to_string().ends_with("(egress.policy is auto)"),
                "{refusal}"
            );
        }
        auto.set_open(true);
        for address in ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"] {
            assert_eq!(auto.check(ip(address)), Ok(()), "{address}");
        }
        for address in ["10.1.2.3", "192.168.1.1", "100.64.0.1", "fd12:3456::1"] {
            assert!(auto.check(ip(address)).is_err(), "{address}");
        }
        for address in ALWAYS_REFUSED {
            assert!(auto.check(ip(address)).is_err(), "{address}");
        }
        auto.set_open(false);
        assert!(auto.check(ip("127.0.0.1")).is_err());
    }

    #[test]
    fn hosts_refused_at_registration() {
        let auto = EgressPolicy::default();
        let host = |text: &str| url::Url::parse(text).unwrap();
        for refused in [
            "http://localhost:9/",
            "http://LocalHost./",
            "http://app.localhost/",
            "http://0x7f.1/",
            "http://2130706433/",
            "http://[::ffff:7f00:1]/",
            "http://169.254.169.254/",
        ] {
            let url = host(refused);
            assert!(auto.check_host(&url.host().unwrap()).is_err(), "{refused}");
        }
        for allowed in [
            "http://hooks.example.com/",
            "http://8.8.8.8/",
            "http://localhost.example/",
        ] {
            let url = host(allowed);
            assert_eq!(auto.check_host(&url.host().unwrap()), Ok(()), "{allowed}");
        }
    }

    #[test]
    fn mapped_addresses_are_checked_as_ipv4() {
        let refusal = EgressPolicy::default()
            .check(ip("::ffff:169.254.169.254"))
            .unwrap_err();
        assert_eq!(refusal.address, ip("169.254.169.254"));
        assert_eq!(
            refusal.to_string(),
            "egress_blocked: 169.254.169.254 is a cloud metadata address"
        );
    }

    #[test]
    fn allow_and_deny_lists() {
        let p = policy(
            EgressMode::PublicOnly,
            &["10.1.0.0/16", "169.254.169.254", "fe80::/64"],
            &["10.1.2.3/32", "8.8.0.0/16"],
        );
        assert_eq!(p.check(ip("10.1.9.9")), Ok(()));
        assert_eq!(p.check(ip("169.254.169.254")), Ok(()));
        assert_eq!(p.check(ip("fe80::1")), Ok(()));
        assert!(p.check(ip("10.2.0.1")).is_err());
        let denied = p.check(ip("10.1.2.3")).unwrap_err();
        assert_eq!(denied.reason, "in egress.deny");
        assert!(p.check(ip("8.8.8.8")).is_err());
        assert!(
            p.check(ip("::ffff:8.8.4.4")).is_err(),
            "mapped, then denied"
        );
        assert_eq!(p.check(ip("1.1.1.1")), Ok(()));
    }

    #[test]
    fn cidr_parsing() {
        assert_eq!(
            "10.0.0.0/8".parse::<Cidr>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().prefix, 0);
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("1.2.3.4")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope/8".parse::<Cidr>().is_err());
        assert!("10.0.0.0/x".parse::<Cidr>().is_err());
        let options: EgressOptions =
            serde_json::from_str(r#"{"policy": "public-only", "allow": ["10.0.0.0/8"]}"#).unwrap();
        assert_eq!(options.policy, EgressMode::PublicOnly);
        assert_eq!(options.allow.len(), 1);
        assert!(serde_json::from_str::<EgressOptions>(r#"{"allow": ["x"]}"#).is_err());
    }
}
