# E2B template for wmo-e2b: E2B's base image (it ships Node.js 20, which the runner needs)
# plus the pi agent packages, prebaked so no sandbox runs npm at bootstrap.
# The runner itself is uploaded by wmo-e2b at bootstrap and needs nothing else.
FROM e2bdev/base:latest

# Keep these versions equal to PI_VERSION in src/runner/pi.rs (a test checks it).
RUN node --version \
 && mkdir -p /opt/wmo-e2b/pi \
 && cd /opt/wmo-e2b/pi \
 && printf '{"name":"wmo-e2b-pi","private":true,"type":"module"}\n' > package.json \
 && npm install --no-audit --no-fund --ignore-scripts --save-exact \
      @mariozechner/pi-agent-core@0.73.1 @mariozechner/pi-ai@0.73.1 \
 && chmod -R a+rX /opt/wmo-e2b
