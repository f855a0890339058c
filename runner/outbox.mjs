// The durable outbox of live.mjs (protocol §3): every outbound frame except
// the keepalive is committed to <dir>/frames/<seq:020>.json, then <dir>/head
// is moved to it, before the frame goes to stdout; so a host that lost the
// stream finds every frame on disk, in order, without gaps. The runner's
// diagnostics are appended to <dir>/stderr.log too.
//
// No fsync: durability covers a lost stream, not a lost machine.

import { errText } from "./values.mjs";

// Opens the outbox in `dir`, continuing the numbering of an existing head.
// Resolves to {outbox, problem}: problem is null when the outbox is ready,
// else why it is not (the outbox can then still append to stderr.log).
// node:fs is imported here, never before: only a durable session needs it.
export async function openOutbox(dir) {
  var fs = await import("node:fs");
  var path = await import("node:path");
  var root = path.resolve(dir);
  var framesDir = path.join(root, "frames");
  var headPath = path.join(root, "head");
  var stderrPath = path.join(root, "stderr.log");
  var last = 0; // the seq of the last committed frame
  var counter = 0; // makes every temp file name unique within the process

  // Writes `text` to `target` through an exclusively created temp sibling and
  // a rename, so a reader never sees half a file.
  function atomicWrite(target, text) {
    var slash = target.lastIndexOf("/");
    var tmp =
      target.slice(0, slash + 1) + "." + target.slice(slash + 1) + ".tmp-" + process.pid + "-" +
      Date.now().toString(36) + "-" + process.hrtime.bigint().toString(36) + "-" + (counter++).toString(36);
    try {
      fs.writeFileSync(tmp, text, { flag: "wx" });
      fs.renameSync(tmp, target);
    } catch (e) {
      try {
        fs.unlinkSync(tmp);
      } catch (e2) {
        // best effort
      }
      throw e;
    }
  }

  function framePath(seq) {
    return framesDir + "/" + String(seq).padStart(20, "0") + ".json";
  }

  var outbox = {
    dir: root,
    // The seq the next committed frame gets.
    nextSeq: function () {
      return last + 1;
    },
    // Commits `frame` (its file, then the head) and returns the JSON text of
    // its envelope, the line to write to stdout. Throws when it cannot commit.
    commit: function (frame) {
      var seq = last + 1;
      var json = JSON.stringify({ transport_seq: seq, frame: frame });
      atomicWrite(framePath(seq), json + "\n");
      atomicWrite(headPath, seq + "\n");
      last = seq;
      return json;
    },
    appendLog: function (line) {
      fs.appendFileSync(stderrPath, line);
    },
  };

  function problem() {
    try {
      fs.mkdirSync(framesDir, { recursive: true });
    } catch (e) {
      return "cannot create " + framesDir + ": " + errText(e);
    }
    var text = null;
    try {
      text = fs.readFileSync(headPath, "utf8");
    } catch (e) {
      if (!e || e.code !== "ENOENT") return "cannot read " + headPath + ": " + errText(e);
    }
    if (text === null) {
      try {
        atomicWrite(headPath, "0\n");
      } catch (e) {
        return "cannot write " + headPath + ": " + errText(e);
      }
      return null;
    }
    var trimmed = text.trim();
    var n = /^[0-9]+$/.test(trimmed) ? Number(trimmed) : NaN;
    if (!Number.isSafeInteger(n)) {
      return headPath + " holds " + JSON.stringify(text.slice(0, 40)) + ", not an integer >= 0";
    }
    last = n;
    return null;
  }

  return { outbox: outbox, problem: problem() };
}
