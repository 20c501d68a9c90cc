#![allow(clippy::unwrap_used)]
use super::AddressClass::*;
use super::*;

fn class(s: &str) -> Option<AddressClass> {
    classify(s.parse().unwrap())
}

fn check(cases: &[(&str, Option<AddressClass>)]) {
    for (addr, want) in cases {
        assert_eq!(class(addr), *want, "{addr}");
    }
}

#[test]
fn ipv4_ranges() {
    check(&[
        ("127.0.0.1", Some(Loopback)),
        ("127.255.255.254", Some(Loopback)),
        ("0.0.0.0", Some(Unspecified)),
        ("0.1.2.3", Some(Reserved)),
        ("10.0.0.1", Some(Private)),
        ("10.255.255.255", Some(Private)),
        ("172.16.0.1", Some(Private)),
        ("172.31.255.255", Some(Private)),
        ("172.15.255.255", None),
        ("172.32.0.0", None),
        ("192.168.1.1", Some(Private)),
        ("169.254.0.1", Some(LinkLocal)),
        ("169.254.169.254", Some(Metadata)),
        ("100.100.100.200", Some(Metadata)),
        ("100.64.0.1", Some(SharedAddressSpace)),
        ("100.127.255.255", Some(SharedAddressSpace)),
        ("100.63.255.255", None),
        ("100.128.0.0", None),
        ("224.0.0.1", Some(Multicast)),
        ("239.255.255.255", Some(Multicast)),
        ("255.255.255.255", Some(Broadcast)),
        ("240.0.0.1", Some(Reserved)),
        ("255.255.255.254", Some(Reserved)),
        ("192.0.0.1", Some(Reserved)),
        ("192.0.0.192", Some(Reserved)),
        ("192.88.99.1", Some(Reserved)),
        ("192.0.2.1", Some(Documentation)),
        ("198.51.100.7", Some(Documentation)),
        ("203.0.113.9", Some(Documentation)),
        ("198.18.0.1", Some(Benchmarking)),
        ("198.19.255.255", Some(Benchmarking)),
        ("198.20.0.0", None),
        ("1.1.1.1", None),
        ("8.8.8.8", None),
        ("93.184.215.14", None),
        ("192.0.3.1", None),
    ]);
}

#[test]
fn ipv6_ranges() {
    check(&[
        ("::1", Some(Loopback)),
        ("::", Some(Unspecified)),
        ("fc00::1", Some(Private)),
        ("fd12:3456::1", Some(Private)),
        ("fec0::1", Some(Private)),
        ("fe80::1", Some(LinkLocal)),
        ("febf::1", Some(LinkLocal)),
        ("fd00:ec2::254", Some(Metadata)),
        ("ff02::1", Some(Multicast)),
        ("2001:db8::1", Some(Documentation)),
        ("3fff::1", Some(Documentation)),
        ("2001:2::1", Some(Benchmarking)),
        ("2001::1", Some(Reserved)),
        ("2001:10::1", Some(Reserved)),
        ("100::1", Some(Reserved)),
        ("64:ff9b:1::1", Some(Reserved)),
        ("4000::1", Some(Reserved)),
        ("2606:4700:4700::1111", None),
        ("2001:4860:4860::8888", None),
        ("2a00:1450::1", None),
    ]);
}

#[test]
fn ipv6_carrying_ipv4_is_judged_by_the_ipv4() {
    check(&[
        // Mapped.
        ("::ffff:127.0.0.1", Some(Loopback)),
        ("::ffff:7f00:1", Some(Loopback)),
        ("::ffff:10.0.0.1", Some(Private)),
        ("::ffff:169.254.169.254", Some(Metadata)),
        ("::ffff:0.0.0.0", Some(Unspecified)),
        ("::ffff:8.8.8.8", None),
        // Compatible.
        ("::127.0.0.1", Some(Loopback)),
        ("::192.168.0.1", Some(Private)),
        ("::0.0.0.2", Some(Reserved)),
        ("::8.8.8.8", None),
        // NAT64 well-known prefix.
        ("64:ff9b::127.0.0.1", Some(Loopback)),
        ("64:ff9b::a9fe:a9fe", Some(Metadata)),
        ("64:ff9b::10.1.2.3", Some(Private)),
        ("64:ff9b::8.8.8.8", None),
        // 6to4.
        ("2002:7f00:1::1", Some(Loopback)),
        ("2002:c0a8:101::", Some(Private)),
        ("2002:a9fe:a9fe::1", Some(Metadata)),
        ("2002:808:808::1", None),
    ]);
}

#[test]
fn every_class_has_a_phrase() {
    for c in [
        Loopback,
        Unspecified,
        Private,
        LinkLocal,
        Metadata,
        SharedAddressSpace,
        Multicast,
        Broadcast,
        Documentation,
        Benchmarking,
        Reserved,
    ] {
        assert!(c.describe().starts_with("a ") || c.describe().starts_with("the "));
    }
}
