#!/usr/bin/env node
// Runs an ONNX model with ONNX Runtime (onnxruntime-node) on .npy inputs and
// writes the model's first output as a float32 .npy file.
//
//   node ort_run.js MODEL.onnx INPUT_NAME IN.npy OUT.npy [NAME=FILE.npy ...]
//   node ort_run.js --check        prints the onnxruntime-node version
//
// IN.npy feeds INPUT_NAME; further graph inputs are given as NAME=FILE.npy.
// Arrays may be float32 or int64 (little-endian, C order).  When the model
// fixes dimension 0 of INPUT_NAME to a size b and the arrays hold N != b rows,
// the rows are run in chunks of b (the last one padded with zeros) and the
// output rows are put back together, so a model exported at a fixed batch can
// still be run on a whole data set.
//
// Exit status 0 on success, 1 on any error (one line on stderr), 2 on usage.

'use strict';

const fs = require('fs');
const path = require('path');

const NPY_MAGIC = Buffer.from([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]); // \x93NUMPY

const DTYPES = {
  '<f4': { name: 'float32', size: 4, Array: Float32Array },
  '<i8': { name: 'int64', size: 8, Array: BigInt64Array },
};

function fail(msg) {
  const err = new Error(msg);
  err.userError = true;
  throw err;
}

// ------------------------------------------------------------------- npy

function parseHeader(text, file) {
  // The header is a Python dict literal such as
  // {'descr': '<f4', 'fortran_order': False, 'shape': (96, 20), }
  const descr = /'descr'\s*:\s*'([^']*)'/.exec(text);
  const order = /'fortran_order'\s*:\s*(True|False)/.exec(text);
  const shape = /'shape'\s*:\s*\(([^)]*)\)/.exec(text);
  if (!descr || !order || !shape) fail(`${file}: unreadable .npy header ${JSON.stringify(text)}`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length > 0).map((s) => {
    if (!/^\d+$/.test(s)) fail(`${file}: bad dimension '${s}' in .npy header`);
    return Number(s);
  });
  return { descr: descr[1], fortran: order[1] === 'True', dims };
}

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.length < 10 || !buf.subarray(0, 6).equals(NPY_MAGIC)) fail(`${file}: not a .npy file`);
  const major = buf[6];
  let headerLen;
  let start;
  if (major === 1) {
    headerLen = buf.readUInt16LE(8);
    start = 10;
  } else if (major === 2 || major === 3) {
    if (buf.length < 12) fail(`${file}: truncated .npy header`);
    headerLen = buf.readUInt32LE(8);
    start = 12;
  } else {
    fail(`${file}: unsupported .npy version ${major}`);
  }
  if (start + headerLen > buf.length) fail(`${file}: truncated .npy header`);
  const h = parseHeader(buf.toString('latin1', start, start + headerLen), file);
  if (h.fortran) fail(`${file}: Fortran-ordered arrays are not supported`);
  const dt = DTYPES[h.descr];
  if (!dt) fail(`${file}: dtype '${h.descr}' not supported (float32 '<f4' or int64 '<i8')`);
  const count = h.dims.reduce((a, b) => a * b, 1);
  const offset = start + headerLen;
  const bytes = count * dt.size;
  if (buf.length - offset !== bytes) {
    fail(`${file}: ${buf.length - offset} data bytes, expected ${bytes} for shape [${h.dims}]`);
  }
  // Copy into a fresh ArrayBuffer so the typed array is aligned.
  const ab = new ArrayBuffer(bytes);
  new Uint8Array(ab).set(buf.subarray(offset, offset + bytes));
  return { dtype: dt.name, dims: h.dims, data: new dt.Array(ab) };
}

function writeNpyFloat32(file, dims, data) {
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': ${shape}, }`;
  // magic (6) + version (2) + length (2) + header, padded to a multiple of 64, ends in \n.
  const total = Math.ceil((10 + header.length + 1) / 64) * 64;
  header = header.padEnd(total - 10 - 1, ' ') + '\n';
  const head = Buffer.alloc(10);
  NPY_MAGIC.copy(head, 0);
  head[6] = 1;
  head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const f32 = data instanceof Float32Array ? data : Float32Array.from(data);
  const body = Buffer.from(f32.buffer, f32.byteOffset, f32.byteLength);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(header, 'latin1'), body]));
}

// ------------------------------------------------------------------- run

function loadOrt() {
  try {
    return require('onnxruntime-node');
  } catch (e) {
    fail(`cannot load onnxruntime-node (${e.message.split('\n')[0]}); ` +
         `run scripts/setup_node.sh`);
  }
  return null;
}

function usage() {
  process.stderr.write('usage: node ort_run.js MODEL.onnx INPUT_NAME IN.npy OUT.npy [NAME=FILE.npy ...]\n' +
                       '       node ort_run.js --check\n');
  process.exit(2);
}

function rowsOf(arr, from, count, rows) {
  // Rows [from, from+count) of arr, zero-padded to `rows` rows.
  const per = arr.dims.slice(1).reduce((a, b) => a * b, 1);
  const out = new arr.data.constructor(rows * per);
  out.set(arr.data.subarray(from * per, (from + count) * per));
  return out;
}

async function main() {
  const argv = process.argv.slice(2);
  if (argv.length === 1 && argv[0] === '--check') {
    const ort = loadOrt();
    const v = (ort.env && ort.env.versions && ort.env.versions.node) ||
      require('onnxruntime-node/package.json').version;
    process.stdout.write(`onnxruntime-node ${v}\n`);
    return;
  }
  if (argv.length < 4) usage();
  const [modelPath, inputName, inPath, outPath] = argv;
  const feeds = [[inputName, readNpy(inPath)]];
  for (const kv of argv.slice(4)) {
    const eq = kv.indexOf('=');
    if (eq <= 0) usage();
    feeds.push([kv.slice(0, eq), readNpy(kv.slice(eq + 1))]);
  }

  const ort = loadOrt();
  const session = await ort.InferenceSession.create(path.resolve(modelPath));
  for (const [name] of feeds) {
    if (!session.inputNames.includes(name)) {
      fail(`${modelPath}: no graph input '${name}' (inputs: ${session.inputNames.join(', ')})`);
    }
  }
  const missing = session.inputNames.filter((n) => !feeds.some(([m]) => m === n));
  if (missing.length) fail(`${modelPath}: no data for graph input(s) ${missing.join(', ')}`);

  // Chunk when the model fixes the batch and the data has another row count.
  const x = feeds[0][1];
  const n = x.dims.length ? x.dims[0] : 1;
  let batch = n;
  const meta = Array.isArray(session.inputMetadata)
    ? session.inputMetadata.find((m) => m.name === inputName) : null;
  if (meta && Array.isArray(meta.shape) && typeof meta.shape[0] === 'number' &&
      meta.shape[0] > 0 && x.dims.length > 0 && meta.shape[0] !== n) {
    batch = meta.shape[0];
    for (const [name, arr] of feeds) {
      if (!arr.dims.length || arr.dims[0] !== n) {
        fail(`${name}: ${arr.dims[0]} rows, but ${inputName} has ${n}; cannot split into batches of ${batch}`);
      }
    }
  }

  const outName = session.outputNames[0];
  const parts = [];
  let outDims = null;
  const chunks = Math.max(1, Math.ceil(n / batch));
  for (let c = 0; c < chunks; c++) {
    const from = c * batch;
    const count = Math.min(batch, n - from);
    const inputs = {};
    for (const [name, arr] of feeds) {
      if (batch === n) {
        inputs[name] = new ort.Tensor(arr.dtype, arr.data, arr.dims);
      } else {
        inputs[name] = new ort.Tensor(arr.dtype, rowsOf(arr, from, count, batch),
                                      [batch].concat(arr.dims.slice(1)));
      }
    }
    const result = await session.run(inputs, [outName]);
    const y = result[outName];
    if (y.type !== 'float32') fail(`${modelPath}: output '${outName}' is ${y.type}, not float32`);
    if (batch === n) {
      parts.push(y.data);
      outDims = y.dims.slice();
    } else {
      if (!y.dims.length || y.dims[0] !== batch) {
        fail(`${modelPath}: output '${outName}' has shape [${y.dims}], not ${batch} rows; ` +
             `cannot run ${n} rows in batches of ${batch}`);
      }
      const per = y.data.length / batch;
      parts.push(y.data.subarray(0, count * per));
      outDims = [n].concat(y.dims.slice(1));
    }
  }
  const total = parts.reduce((a, p) => a + p.length, 0);
  const out = new Float32Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  writeNpyFloat32(outPath, outDims, out);
  process.stdout.write(`ort_run: ${path.basename(modelPath)}: ${inputName} [${x.dims}] -> ` +
                       `${outName} [${outDims}] in ${chunks} run(s)\n`);
}

main().catch((e) => {
  const msg = (e && e.message) ? e.message : String(e);
  process.stderr.write(`ort_run: error: ${msg.replace(/\s*\n\s*/g, ' ')}\n`);
  if (process.env.ORT_RUN_DEBUG && e && e.stack) process.stderr.write(`${e.stack}\n`);
  process.exit(1);
});
