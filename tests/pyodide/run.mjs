// tests/pyodide/run.mjs: the Node driver of the Pyodide test (pyodide.sh starts the daemon).
//
//   node run.mjs --host H --port P --token-file F --work DIR
//   (or SHIM_HOST, SHIM_PORT, SHIM_TOKEN_FILE, SHIM_WORK in the environment)
//
// Loads Pyodide (node_modules next to this file, or PYODIDE_DIR: a directory holding
// node_modules/pyodide), writes sandbox_shim from the source tree (SBX_PY_SRC, default
// ../../sdk/python/src) into Pyodide's virtual filesystem, and runs checks.py, which talks
// to the daemon through a Node net.Socket made here. Exit status: 0 when every check
// passed, 1 otherwise.

import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));

function option(name, env) {
  const i = process.argv.indexOf(`--${name}`);
  const v = i > 0 ? process.argv[i + 1] : process.env[env];
  if (!v) {
    console.error(`run.mjs: give --${name} or ${env}`);
    process.exit(2);
  }
  return v;
}

const host = option("host", "SHIM_HOST");
const port = Number(option("port", "SHIM_PORT"));
const token = fs.readFileSync(option("token-file", "SHIM_TOKEN_FILE"), "utf8").trim();
const work = option("work", "SHIM_WORK");
const src = path.resolve(process.env.SBX_PY_SRC || path.join(HERE, "../../sdk/python/src"));

// A hang must end as a failure, not as a ctest timeout with nothing said.
setTimeout(() => {
  console.log("not ok - run.mjs: still running after 300 s");
  process.exit(1);
}, 300_000).unref();

// ---- a Node net.Socket for Python: the JS half of checks.py's NodeSocketTransport ----

const HIGH_WATER = 1 << 20; // received bytes Python has not read yet: pause the socket above this,
const LOW_WATER = 256 << 10; // resume below this

function closedError() {
  return Object.assign(new Error("the socket is closed"), { code: "EPIPE" });
}

function connect(host, port) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port, noDelay: true });
    const chunks = []; // Uint8Arrays received and not read yet
    let queued = 0;
    let eof = false;
    let failure = null;
    let wake = null; // the resolve of a read() waiting for data

    const poke = () => {
      if (wake) {
        const w = wake;
        wake = null;
        w();
      }
    };
    sock.on("data", (buf) => {
      // Pyodide takes Uint8Arrays, not Buffers: a view of the same memory
      chunks.push(new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength));
      queued += buf.byteLength;
      if (queued > HIGH_WATER) sock.pause();
      poke();
    });
    sock.on("end", () => {
      eof = true;
      poke();
    });
    sock.on("close", () => {
      eof = true;
      poke();
    });
    sock.on("error", (e) => {
      failure = e; // 'close' follows
      poke();
    });
    sock.once("error", reject); // before 'connect' only
    sock.once("connect", () => {
      sock.off("error", reject);
      resolve({
        // the next chunk; an empty one at EOF; rejects after a socket error
        async read() {
          while (!chunks.length && !eof && !failure) await new Promise((r) => (wake = r));
          if (chunks.length) {
            const c = chunks.shift();
            queued -= c.byteLength;
            if (queued < LOW_WATER && sock.isPaused()) sock.resume();
            return c;
          }
          if (failure) throw failure;
          return new Uint8Array(0);
        },
        // settles once the socket takes more: at once below its highWaterMark, else at 'drain'
        write(u8) {
          if (failure || sock.destroyed || sock.writableEnded) return Promise.reject(failure || closedError());
          if (sock.write(u8)) return Promise.resolve();
          return new Promise((resolve, reject) => {
            const settle = (err) => {
              sock.off("drain", onDrain);
              sock.off("close", onClose);
              if (err) reject(err);
              else resolve();
            };
            const onDrain = () => settle(null);
            const onClose = () => settle(failure || closedError());
            sock.on("drain", onDrain);
            sock.on("close", onClose);
          });
        },
        close() {
          return new Promise((resolve) => {
            if (sock.destroyed) return resolve();
            sock.once("close", resolve);
            sock.end();
            setTimeout(() => sock.destroy(), 1000).unref();
          });
        },
        closed: () => sock.destroyed,
      });
    });
  });
}

// ---- what else Python asks of the host ----

const nodeHost = {
  connect,
  sha256: (u8) => crypto.createHash("sha256").update(u8).digest("hex"),
  // "" when /proc/PID is gone, else "STATE STARTTIME" (fields 3 and 22 of /proc/PID/stat)
  proc(pid) {
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    } catch {
      return "";
    }
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" "); // after "PID (COMM) "
    return `${f[0]} ${f[19]}`;
  },
  cmdline(pid) {
    try {
      return fs.readFileSync(`/proc/${pid}/cmdline`, "latin1");
    } catch {
      return "";
    }
  },
};

// ---- Pyodide, the package from the source tree, the checks ----

function pyodideModule() {
  const dirs = [HERE, process.env.PYODIDE_DIR].filter(Boolean);
  for (const d of dirs.reverse()) {
    const f = path.join(d, "node_modules/pyodide/pyodide.mjs");
    if (fs.existsSync(f)) return f;
  }
  console.error(`run.mjs: no node_modules/pyodide in ${dirs.join(" or ")} (npm ci there)`);
  process.exit(2);
}

function copyTree(py, from, to) {
  py.FS.mkdirTree(to);
  for (const e of fs.readdirSync(from, { withFileTypes: true })) {
    const f = path.join(from, e.name);
    if (e.isDirectory() && e.name !== "__pycache__") copyTree(py, f, `${to}/${e.name}`);
    else if (e.isFile() && (e.name.endsWith(".py") || e.name === "py.typed"))
      py.FS.writeFile(`${to}/${e.name}`, fs.readFileSync(f)); // the package's files only
  }
}

const { loadPyodide } = await import(pathToFileURL(pyodideModule()).href);
const py = await loadPyodide({ env: { PYTHONDONTWRITEBYTECODE: "1" } });
const SRC = "/sbx-src";
copyTree(py, path.join(src, "sandbox_shim"), `${SRC}/sandbox_shim`);
py.registerJsModule("node_host", nodeHost);
py.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(SRC)})`);
for (const [k, v] of Object.entries({ HOST: host, PORT: port, TOKEN: token, WORK: work, SRC }))
  py.globals.set(k, v);

let failed;
try {
  failed = await py.runPythonAsync(fs.readFileSync(path.join(HERE, "checks.py"), "utf8"), {
    filename: path.join(HERE, "checks.py"),
  });
} catch (e) {
  console.log(`not ok - checks.py raised: ${e.message || e}`);
  failed = 1;
}
process.exit(failed === 0 ? 0 : 1);
