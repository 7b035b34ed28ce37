// Loads extension.js with a stand-in for the `vscode` module (which exists only inside VS Code),
// so a wrong require path or a syntax error fails here rather than at activation.
'use strict';

const assert = require('node:assert/strict');
const Module = require('node:module');
const path = require('node:path');
const { test } = require('node:test');

/** A permissive stand-in: every property is a constructible, callable stand-in too. */
function standIn() {
  const target = function () {};
  return new Proxy(target, {
    get: (t, key) => {
      if (key === 'prototype') return t.prototype;
      if (key === Symbol.toPrimitive) return () => '';
      if (!(key in t)) t[key] = standIn();
      return t[key];
    },
    apply: () => standIn(),
    construct: () => standIn(),
  });
}

test('extension.js loads and exports activate and deactivate', () => {
  const vscode = standIn();
  const resolve = Module._resolveFilename;
  const load = Module._load;
  Module._load = function (request, ...rest) {
    return request === 'vscode' ? vscode : load.call(this, request, ...rest);
  };
  try {
    const ext = require(path.join(__dirname, '..', 'extension.js'));
    assert.equal(typeof ext.activate, 'function');
    assert.equal(typeof ext.deactivate, 'function');
  } finally {
    Module._load = load;
    Module._resolveFilename = resolve;
  }
});

test('package.json points at the files it names', () => {
  const fs = require('node:fs');
  const root = path.join(__dirname, '..');
  const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
  assert.equal(pkg.main, './extension.js');
  assert.deepEqual(pkg.activationEvents, ['onLanguage:recipe']);
  const lang = pkg.contributes.languages.find((l) => l.id === 'recipe');
  assert.deepEqual(lang.extensions, ['.rcp']);
  for (const file of [pkg.main, lang.configuration, pkg.contributes.grammars[0].path]) {
    assert.ok(fs.existsSync(path.join(root, file)), `${file} is missing`);
  }
  const settings = pkg.contributes.configuration.properties;
  assert.equal(settings['recipe.server.path'].default, 'recipe');
  assert.deepEqual(settings['recipe.server.extraArgs'].default, []);
  assert.equal(settings['recipe.trace.server'].default, 'off');
  // Exact versions, so that the lockfile and the .vsix are reproducible.
  for (const deps of [pkg.dependencies, pkg.devDependencies]) {
    for (const [name, version] of Object.entries(deps)) {
      assert.match(version, /^\d+\.\d+\.\d+$/, `${name} is not pinned exactly`);
    }
  }
  JSON.parse(fs.readFileSync(path.join(root, lang.configuration), 'utf8'));
});

test('the indentation rules indent after an open bracket, outside strings and comments', () => {
  const fs = require('node:fs');
  const conf = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'language-configuration.json'), 'utf8'));
  const increase = new RegExp(conf.indentationRules.increaseIndentPattern);
  const decrease = new RegExp(conf.indentationRules.decreaseIndentPattern);
  for (const line of ['model bert {', '  task = classify(', '  no_decay = [', 'data {  # the files']) {
    assert.ok(increase.test(line), line);
  }
  for (const line of ['recipe "cls"', 'x = "{"', 'x = 1  # {', 'zero 2 { overlap_comm = true }']) {
    assert.ok(!increase.test(line), line);
  }
  assert.ok(decrease.test('  }') && decrease.test(']') && !decrease.test('  lr = 3e-5'));
  new RegExp(conf.wordPattern);
});
