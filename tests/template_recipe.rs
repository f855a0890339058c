//! The E2B template recipe bakes exactly what the bootstrap looks for, from the inputs the
//! host builds its own bundle from.

use std::path::Path;

use wmo_e2b::runner::pi;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

#[test]
fn the_template_bakes_the_bundle_where_the_bootstrap_looks_from_the_same_inputs() {
    let recipe = read("scripts/e2b-template/e2b.Dockerfile");
    let build = read("scripts/e2b-template/build.sh");
    for (name, _) in pi::BUILD_INPUTS {
        assert!(
            build.contains(&format!("../../runner/pi/{name}")),
            "build.sh does not copy runner/pi/{name} into the build context"
        );
    }
    assert!(recipe.contains("COPY pi/ /tmp/wmo-pi-build/"), "{recipe}");
    assert!(
        recipe.contains(&format!("npm {}", pi::NPM_CI_ARGS.join(" "))),
        "the recipe does not install the locked inputs as the host does"
    );
    assert!(
        recipe.contains(&format!("node build.mjs {}", pi::TEMPLATE_PI_BUNDLE)),
        "the recipe bakes the bundle elsewhere than {}",
        pi::TEMPLATE_PI_BUNDLE
    );
    assert_eq!(
        pi::TEMPLATE_PI_BUNDLE,
        format!("{}/{}", pi::SANDBOX_PI_DIR, pi::BUNDLE_FILE)
    );
}
