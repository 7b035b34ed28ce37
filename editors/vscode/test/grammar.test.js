// Tokenizes recipes with the TextMate grammar (the engine VS Code uses) and checks the scopes.
// Run with `npm test` (node --test).
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');
const oniguruma = require('vscode-oniguruma');
const vsctm = require('vscode-textmate');

const root = path.join(__dirname, '..');
const grammarPath = path.join(root, 'syntaxes', 'recipe.tmLanguage.json');
// The repository root, for recipes/ and src/schema/blocks.rs: RECIPE_ROOT when the extension
// is tested from a copy (tests/editors.rs does that), else two folders up.
const repoRoot = process.env.RECIPE_ROOT || path.join(root, '..', '..');
const recipesDir = path.join(repoRoot, 'recipes');

let grammarPromise;
function loadGrammar() {
  grammarPromise ??= (async () => {
    const wasm = fs.readFileSync(require.resolve('vscode-oniguruma/release/onig.wasm'));
    await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
    const registry = new vsctm.Registry({
      onigLib: Promise.resolve({
        createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
        createOnigString: (s) => new oniguruma.OnigString(s),
      }),
      loadGrammar: async (scopeName) =>
        scopeName === 'source.recipe'
          ? vsctm.parseRawGrammar(fs.readFileSync(grammarPath, 'utf8'), grammarPath)
          : null,
    });
    return registry.loadGrammar('source.recipe');
  })();
  return grammarPromise;
}

/** Tokenizes `text`: a list of { line, text, scopes } (scopes innermost last). */
async function tokenize(text) {
  const grammar = await loadGrammar();
  const out = [];
  let state = vsctm.INITIAL;
  text.split(/\r?\n/).forEach((line, i) => {
    const r = grammar.tokenizeLine(line, state);
    for (const t of r.tokens) {
      out.push({ line: i + 1, text: line.slice(t.startIndex, t.endIndex), scopes: t.scopes });
    }
    state = r.ruleStack;
  });
  return out;
}

/** The scopes of the first token on `line` (1-based) whose text is `text`. */
function scopesOf(tokens, line, text) {
  const t = tokens.find((t) => t.line === line && t.text === text);
  assert.ok(t, `no token ${JSON.stringify(text)} on line ${line}: ` +
    JSON.stringify(tokens.filter((t) => t.line === line).map((t) => t.text)));
  return t.scopes;
}

function expectScope(tokens, line, text, scope) {
  const scopes = scopesOf(tokens, line, text);
  assert.ok(
    scopes.some((s) => s === scope || s.startsWith(scope + '.')),
    `${JSON.stringify(text)} on line ${line}: expected ${scope}, got ${scopes.join(' ')}`,
  );
}

function expectNoScope(tokens, line, text, scope) {
  const scopes = scopesOf(tokens, line, text);
  assert.ok(
    !scopes.some((s) => s === scope || s.startsWith(scope + '.')),
    `${JSON.stringify(text)} on line ${line}: unexpected ${scope} in ${scopes.join(' ')}`,
  );
}

/** The line number (1-based) of the first line of `text` that contains `needle` (or matches it). */
function lineOf(text, needle) {
  const hit = (l) => (needle instanceof RegExp ? needle.test(l) : l.includes(needle));
  const i = text.split(/\r?\n/).findIndex(hit);
  assert.ok(i >= 0, `no line contains ${needle}`);
  return i + 1;
}

test('the grammar is well-formed JSON with the right scope name', () => {
  const g = JSON.parse(fs.readFileSync(grammarPath, 'utf8'));
  assert.equal(g.scopeName, 'source.recipe');
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  assert.equal(pkg.contributes.grammars[0].scopeName, g.scopeName);
  assert.equal(path.normalize(pkg.contributes.grammars[0].path), path.normalize('./syntaxes/recipe.tmLanguage.json'));
});

test('every regex in the grammar compiles with Oniguruma', async () => {
  await loadGrammar();
  const g = JSON.parse(fs.readFileSync(grammarPath, 'utf8'));
  const regexes = [];
  (function walk(node) {
    if (Array.isArray(node)) return node.forEach(walk);
    if (node && typeof node === 'object') {
      for (const k of ['match', 'begin', 'end']) if (typeof node[k] === 'string') regexes.push(node[k]);
      Object.values(node).forEach(walk);
    }
  })(g);
  assert.ok(regexes.length > 10);
  for (const re of regexes) {
    assert.doesNotThrow(() => new oniguruma.OnigScanner([re]).dispose(), `bad regex: ${re}`);
  }
});

test('every block of the schema is a keyword in the grammar', () => {
  // src/schema/blocks.rs is the list of blocks; the grammar must know each of them.
  const blocksRs = fs.readFileSync(path.join(repoRoot, 'src', 'schema', 'blocks.rs'), 'utf8');
  const table = blocksRs.slice(blocksRs.indexOf('pub static BLOCKS'));
  const names = [...table.matchAll(/BlockSpec \{\s*name: "([a-z_]+)"/g)].map((m) => m[1]);
  assert.ok(names.length >= 10, `found blocks: ${names}`);
  const grammar = fs.readFileSync(grammarPath, 'utf8');
  for (const name of names) {
    assert.match(grammar, new RegExp(`[(|]${name}[|)]`), `block ${name} is missing from the grammar`);
  }
});

test('recipes/cls.rcp gets the expected scopes', async () => {
  const text = fs.readFileSync(path.join(recipesDir, 'cls.rcp'), 'utf8');
  const tokens = await tokenize(text);
  const l = (needle) => lineOf(text, needle);

  // Comments, whole-line and trailing.
  expectScope(tokens, 1, '#', 'punctuation.definition.comment.recipe');
  const comment = tokens.find((t) => t.line === 1 && t.scopes.includes('comment.line.number-sign.recipe') && t.text !== '#');
  assert.ok(comment && comment.text.startsWith(' cls.rcp'));
  expectScope(tokens, l('HF-layout dir'), ' HF-layout dir or hub id', 'comment.line.number-sign.recipe');
  expectScope(tokens, l('per GPU'), ' per GPU', 'comment.line.number-sign.recipe');

  // Block keywords and kinds.
  expectScope(tokens, l('recipe "cls"'), 'recipe', 'keyword.other.block.recipe');
  for (const kw of ['model', 'data', 'batch', 'optimizer', 'schedule', 'train', 'zero']) {
    expectScope(tokens, l(new RegExp(`^${kw} `)), kw, 'keyword.other.block.recipe');
  }
  expectScope(tokens, l('model bert'), 'bert', 'entity.name.type.kind.recipe');
  expectScope(tokens, l('optimizer adamw'), 'adamw', 'entity.name.type.kind.recipe');
  expectScope(tokens, l('schedule WarmupDecayLR'), 'WarmupDecayLR', 'entity.name.type.kind.recipe');

  // Strings, including a label.
  expectScope(tokens, l('recipe "cls"'), 'cls', 'string.quoted.double.recipe');
  expectScope(tokens, l('from ='), 'sentence-transformers/all-MiniLM-L6-v2', 'string.quoted.double.recipe');
  expectNoScope(tokens, l('from ='), 'sentence-transformers/all-MiniLM-L6-v2', 'comment');

  // Keys, including ones named like blocks (data { train = ... }) and a key of two words.
  expectScope(tokens, l('from ='), 'from', 'variable.other.property.recipe');
  expectScope(tokens, l('train   ='), 'train', 'variable.other.property.recipe');
  expectNoScope(tokens, l('train   ='), 'train', 'keyword.other.block.recipe');
  expectScope(tokens, l('precision ='), 'precision', 'variable.other.property.recipe');
  expectScope(tokens, l('max_len'), 'max_len', 'variable.other.property.recipe');
  expectScope(tokens, l('lr = 3e-5'), 'lr', 'variable.other.property.recipe');
  expectScope(tokens, l('lr = 3e-5'), 'weight_decay', 'variable.other.property.recipe');
  expectScope(tokens, l('offload optimizer'), 'offload', 'variable.other.property.recipe');
  expectScope(tokens, l('offload optimizer'), 'optimizer', 'variable.other.property.recipe');
  expectScope(tokens, l('offload optimizer'), 'reduce_bucket', 'variable.other.property.recipe');
  expectScope(tokens, l('lr = 3e-5'), '=', 'keyword.operator.assignment.recipe');

  // Numbers, with suffixes.
  expectScope(tokens, l('zero 2'), '2', 'constant.numeric.recipe');
  expectScope(tokens, l('max_len'), '128', 'constant.numeric.recipe');
  expectScope(tokens, l('lr = 3e-5'), '3e-5', 'constant.numeric.recipe');
  expectScope(tokens, l('lr = 3e-5'), '0.999', 'constant.numeric.recipe');
  expectScope(tokens, l('lr = 3e-5'), '1e-8', 'constant.numeric.recipe');
  expectScope(tokens, l('warmup = 6%'), '%', 'keyword.other.unit.suffix.recipe');
  expectScope(tokens, l('warmup = 6%'), '6', 'constant.numeric.recipe');
  expectScope(tokens, l('reduce_bucket = 60M'), '60', 'constant.numeric.recipe');
  expectScope(tokens, l('reduce_bucket = 60M'), 'M', 'keyword.other.unit.suffix.recipe');

  // Booleans, bare words, calls.
  expectScope(tokens, l('overlap_comm = true'), 'true', 'constant.language.boolean.recipe');
  expectScope(tokens, l('precision = fp16'), 'fp16', 'variable.other.enummember.recipe');
  expectScope(tokens, l('offload optimizer = cpu'), 'cpu', 'variable.other.enummember.recipe');
  expectScope(tokens, l('classify('), 'classify', 'entity.name.function.recipe');
  expectScope(tokens, l('classify('), 'labels', 'variable.parameter.recipe');
  expectScope(tokens, l('classify('), 'ham', 'string.quoted.double.recipe');

  // Nothing in cls.rcp is invalid, and the tokenizer ends back at the top level.
  const bad = tokens.filter((t) => t.scopes.some((s) => s.startsWith('invalid')));
  assert.deepEqual(bad, []);
  const last = tokens.filter((t) => t.line === l('zero 2')).pop();
  assert.deepEqual(last.scopes, ['source.recipe', 'meta.block.body.recipe', 'punctuation.section.block.end.recipe']);
});

test('every recipe in recipes/ tokenizes without invalid tokens', async () => {
  const files = fs.readdirSync(recipesDir).filter((f) => f.endsWith('.rcp'));
  assert.ok(files.length > 0);
  for (const f of files) {
    const tokens = await tokenize(fs.readFileSync(path.join(recipesDir, f), 'utf8'));
    const bad = tokens.filter((t) => t.scopes.some((s) => s.startsWith('invalid')));
    assert.deepEqual(bad, [], f);
  }
});

test('target, raw blocks, escapes and bad numbers', async () => {
  const text = [
    'target transformers "5.24.0",', // 1
    '       accelerate "1.15.0",', // 2
    '       deepspeed "0.19.8"', // 3 (docs/language.md's layout: a pair, not the block)
    'deepspeed {', // 4
    '  zero_optimization.stage3_prefetch_bucket_size = 5e7', // 5
    '  flops_profiler { enabled = true, profile_step = 2 }', // 6
    '}', // 7
    'hf { report_to = ["tensorboard"], run_name = "a\\"b\\u{e9}\\q" }', // 8
    'zero 3 { offload param = nvme(path: "/nvme", buffer_count: 8), bad = 1.2.3, mem = 64Ki }', // 9
    'cluster { gpus = 8 }', // 10
  ].join('\n');
  const tokens = await tokenize(text);

  expectScope(tokens, 1, 'target', 'keyword.other.block.recipe');
  expectScope(tokens, 1, 'transformers', 'entity.name.tag.component.recipe');
  expectScope(tokens, 2, 'accelerate', 'entity.name.tag.component.recipe');
  expectScope(tokens, 2, '1.15.0', 'string.quoted.double.recipe');

  expectScope(tokens, 3, 'deepspeed', 'entity.name.tag.component.recipe');
  expectScope(tokens, 3, '0.19.8', 'string.quoted.double.recipe');

  expectScope(tokens, 4, 'deepspeed', 'keyword.other.block.recipe');
  expectScope(tokens, 5, 'zero_optimization', 'variable.other.property.recipe');
  expectScope(tokens, 5, '.', 'punctuation.accessor.recipe');
  expectScope(tokens, 5, 'stage3_prefetch_bucket_size', 'variable.other.property.recipe');
  expectScope(tokens, 5, '5e7', 'constant.numeric.recipe');
  expectScope(tokens, 6, 'flops_profiler', 'variable.other.property.recipe');
  expectScope(tokens, 6, 'profile_step', 'variable.other.property.recipe');
  assert.ok(scopesOf(tokens, 6, 'enabled').filter((s) => s === 'meta.block.body.recipe').length === 2,
    'a nested section is a body inside a body');

  expectScope(tokens, 8, 'hf', 'keyword.other.block.recipe');
  expectScope(tokens, 8, '\\"', 'constant.character.escape.recipe');
  expectScope(tokens, 8, '\\u{e9}', 'constant.character.escape.recipe');
  expectScope(tokens, 8, '\\q', 'invalid.illegal.unrecognized-escape.recipe');

  expectScope(tokens, 9, 'offload', 'variable.other.property.recipe');
  expectScope(tokens, 9, 'param', 'variable.other.property.recipe');
  expectScope(tokens, 9, 'nvme', 'entity.name.function.recipe');
  expectScope(tokens, 9, 'buffer_count', 'variable.parameter.recipe');
  expectScope(tokens, 9, '1.2.3', 'invalid.illegal.number.recipe');
  expectScope(tokens, 9, 'Ki', 'keyword.other.unit.suffix.recipe');

  expectScope(tokens, 10, 'cluster', 'keyword.other.block.recipe');
  expectNoScope(tokens, 10, 'cluster', 'entity.name.tag.component.recipe');
});

test('a block after target ends it, recipe "name" included', async () => {
  const tokens = await tokenize('target transformers "5.24.0"\nrecipe "cls"\ntarget deepspeed "0.19.8"\nzero 2');
  expectScope(tokens, 2, 'recipe', 'keyword.other.block.recipe');
  expectScope(tokens, 4, 'zero', 'keyword.other.block.recipe');
  expectScope(tokens, 4, '2', 'constant.numeric.recipe');
});

test('an unterminated string ends at the end of its line', async () => {
  const tokens = await tokenize('data { train = "abc\n  eval = "x" }');
  expectScope(tokens, 2, 'eval', 'variable.other.property.recipe');
  expectNoScope(tokens, 2, 'eval', 'string');
});
