//! The E2B template recipe prebakes exactly what the bootstrap looks for.

use wmo_e2b::runner::pi;

#[test]
fn the_template_pins_the_pi_version_and_path_the_bootstrap_uses() {
    let recipe = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scripts/e2b-template/e2b.Dockerfile"),
    )
    .unwrap();
    for spec in pi::specs() {
        assert!(recipe.contains(&spec), "the recipe does not install {spec}");
    }
    let dir = pi::TEMPLATE_PI_MODULES.trim_end_matches("/node_modules");
    assert!(
        recipe.contains(&format!("cd {dir}")),
        "the recipe installs elsewhere than {dir}"
    );
}
