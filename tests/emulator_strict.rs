//! The emulator as strict as the API it stands for, where a looser answer would hide a
//! client's bug: a v1 connect needs its timeout, a sandbox reports the egress it was asked
//! for (null where nothing was asked), `/sandboxes/metrics` names no sandbox, timeouts stay
//! within the team's plan, and a template it does not serve is not found.

mod support;

use serde_json::json;
use support::emulator::*;
use wmo_e2b::emulator::Plan;

/// The `message` of an error answer.
fn message_of(reply: &Reply) -> String {
    reply.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn timeouts_stay_within_the_plan() {
    let hobby = start();
    let create = |emu: &Emu, timeout: i64| {
        emu.api(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": "base", "timeout": timeout})),
        )
    };
    let too_long = create(&hobby, 3601);
    assert_eq!(too_long.status, 400);
    let message = message_of(&too_long);
    assert!(
        message.contains("hobby") && message.contains("3600 s"),
        "{message}"
    );
    let sbx = hobby.create(json!({"templateID": "base", "timeout": 3600}));
    let id = sbx["sandboxID"].as_str().unwrap();
    for (path, body) in [
        (format!("/sandboxes/{id}/timeout"), json!({"timeout": 3601})),
        (format!("/sandboxes/{id}/connect"), json!({"timeout": 3601})),
        (
            format!("/v2/sandboxes/{id}/connect"),
            json!({"timeout": 3601}),
        ),
    ] {
        assert_eq!(hobby.api("POST", &path, Some(body)).status, 400, "{path}");
    }
    assert_eq!(
        hobby
            .api(
                "POST",
                &format!("/sandboxes/{id}/timeout"),
                Some(json!({"timeout": 3600}))
            )
            .status,
        204
    );

    let pro = start_configured(|c| c.plan = Plan::Pro);
    assert_eq!(create(&pro, 3601).status, 201);
    assert_eq!(create(&pro, 24 * 3600).status, 201);
    let too_long = create(&pro, 24 * 3600 + 1);
    assert_eq!(too_long.status, 400);
    let message = message_of(&too_long);
    assert!(
        message.contains("pro") && message.contains("86400 s"),
        "{message}"
    );
}

#[test]
fn a_template_it_does_not_serve_is_not_found() {
    let create = |emu: &Emu, template: &str| {
        emu.api(
            "POST",
            "/v2/sandboxes",
            Some(json!({"templateID": template, "timeout": 30})),
        )
    };
    let plain = start();
    assert_eq!(create(&plain, "base").status, 201);
    let unknown = create(&plain, "mine");
    assert_eq!(unknown.status, 404);
    let message = message_of(&unknown);
    assert_eq!(message, "template 'mine' not found");
    let named = start_configured(|c| c.templates = vec!["mine".into()]);
    assert_eq!(create(&named, "mine").status, 201);
    assert_eq!(create(&named, "other").status, 404);
}

#[test]
fn a_v1_connect_without_its_timeout_is_refused() {
    let emu = start();
    let sbx = emu.create(json!({"templateID": "base", "timeout": 30}));
    let id = sbx["sandboxID"].as_str().unwrap();
    let v1 = format!("/sandboxes/{id}/connect");
    assert_eq!(emu.api("POST", &v1, Some(json!({}))).status, 400);
    assert_eq!(
        emu.api("POST", &v1, Some(json!({"timeout": 60}))).status,
        200
    );
    // v2's body may leave it out.
    let v2 = format!("/v2/sandboxes/{id}/connect");
    assert_eq!(emu.api("POST", &v2, Some(json!({}))).status, 200);
}

#[test]
fn a_sandbox_reports_the_egress_it_was_asked_for() {
    let emu = start();
    let detail = |sbx: &serde_json::Value| {
        let id = sbx["sandboxID"].as_str().unwrap();
        emu.api("GET", &format!("/sandboxes/{id}"), None).json()
    };
    let plain = detail(&emu.create(json!({"templateID": "base", "timeout": 30})));
    // Present and null; `network` absent, since the SDK parses a present one as an object.
    assert_eq!(
        plain.get("allowInternetAccess"),
        Some(&serde_json::Value::Null),
        "{plain}"
    );
    assert!(plain.get("network").is_none(), "{plain}");
    let locked = detail(
        &emu.create(json!({"templateID": "base", "timeout": 30, "allow_internet_access": false})),
    );
    assert_eq!(locked["allowInternetAccess"], false, "{locked}");
    let denied = detail(&emu.create(json!({
        "templateID": "base", "timeout": 30, "network": {"denyOut": ["0.0.0.0/0"]}
    })));
    assert_eq!(
        denied["network"]["denyOut"],
        json!(["0.0.0.0/0"]),
        "{denied}"
    );
    assert!(denied["allowInternetAccess"].is_null(), "{denied}");
    // An update replaces the whole egress config: internet access is then decided.
    let id = denied["sandboxID"].as_str().unwrap();
    let update = json!({"denyOut": ["0.0.0.0/0"]});
    assert_eq!(
        emu.api("PUT", &format!("/sandboxes/{id}/network"), Some(update))
            .status,
        204
    );
    let updated = detail(&denied);
    assert_eq!(updated["allowInternetAccess"], false, "{updated}");
}

#[test]
fn sandbox_metrics_name_no_sandbox() {
    let emu = start();
    let r = emu.api("GET", "/sandboxes/metrics", None);
    assert_eq!(r.status, 404);
    let message = message_of(&r);
    assert!(message.contains("not served"), "{message}");
}
