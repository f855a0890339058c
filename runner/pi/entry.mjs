// The entry point of the pi bundle, and everything it exports: what the pi harness
// (runner/pi_harness.mjs) uses of pi. The real agent loop, and the assistant-message
// event stream that the harness's streamFn hands back to it.
export { runAgentLoop } from "@mariozechner/pi-agent-core";
export { createAssistantMessageEventStream } from "@mariozechner/pi-ai";
