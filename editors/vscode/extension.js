// The recipe extension: runs `recipe lsp` over stdio for .rcp files (and DeepSpeed config JSON).
'use strict';

const vscode = require('vscode');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

/** @type {LanguageClient | undefined} */
let client;

async function startClient() {
  const config = vscode.workspace.getConfiguration('recipe');
  const command = config.get('server.path') || 'recipe';
  const args = ['lsp', ...config.get('server.extraArgs', [])];
  const executable = { command, args, transport: TransportKind.stdio };

  // The client id `recipe` makes the client read `recipe.trace.server` itself.
  client = new LanguageClient(
    'recipe',
    'Recipe Language Server',
    { run: executable, debug: executable },
    {
      documentSelector: [
        { language: 'recipe' },
        { pattern: '**/ds_config*.json' },
        { pattern: '**/training_args.json' },
      ],
    },
  );
  try {
    await client.start();
  } catch (err) {
    vscode.window.showErrorMessage(
      `Recipe: could not start \`${[command, ...args].join(' ')}\`: ${err.message || err}. ` +
        'Set recipe.server.path to the recipe executable.',
    );
  }
}

async function stopClient() {
  const c = client;
  client = undefined;
  if (c) {
    try {
      await c.stop();
    } catch {
      // It never started, or is already gone.
    }
  }
}

/** @param {vscode.ExtensionContext} context */
async function activate(context) {
  // Restart the server when its command line changes.
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (
        event.affectsConfiguration('recipe.server.path') ||
        event.affectsConfiguration('recipe.server.extraArgs')
      ) {
        await stopClient();
        await startClient();
      }
    }),
  );
  await startClient();
}

function deactivate() {
  return stopClient();
}

module.exports = { activate, deactivate };
