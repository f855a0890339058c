//! Which process.Process method serves a call: the streaming ones write their own answer,
//! the unary ones go through `unary`.

use std::sync::Arc;

use super::input::{close_stdin, send_input, stream_input};
use super::start::{connect, start};
use super::stream::stream_call;
use super::table::{list, send_signal, update};
use crate::emulator::connect::{Code, RpcError};
use crate::emulator::envd::call::unary;
use crate::emulator::http::{Request, Responder, Response};
use crate::emulator::state::{SandboxEntry, Shared};

pub(in crate::emulator) fn handle(
    shared: &Shared,
    entry: &Arc<SandboxEntry>,
    method: &str,
    req: Request,
    out: &mut Responder<'_>,
) {
    match method {
        "Start" => stream_call(shared, entry, &req, out, start),
        "Connect" => stream_call(shared, entry, &req, out, connect),
        "StreamInput" => stream_input(shared, entry, &req, out),
        unary_method => {
            let _ = out.send(unary_call(entry, unary_method, &req));
        }
    }
}

fn unary_call(entry: &SandboxEntry, method: &str, req: &Request) -> Response {
    match method {
        "List" => unary(req, |_, _| list(entry)),
        "SendInput" => unary(req, |m, _| send_input(entry, m)),
        "CloseStdin" => unary(req, |m, _| close_stdin(entry, m)),
        "SendSignal" => unary(req, |m, _| send_signal(entry, m)),
        "Update" => unary(req, |m, _| update(entry, m)),
        other => Response::json(
            404,
            &RpcError::new(
                Code::Unimplemented,
                format!("process.Process/{other} is not implemented"),
            )
            .to_json(),
        ),
    }
}
