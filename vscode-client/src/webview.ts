// The page around a webview's content, the same for every view: a strict Content-Security-Policy (styles from the
// extension or inline, scripts only inline with this page's nonce), the editor's font and colours.
// Self-contained (no CDN, no bundled library): everything stays local.

export function webviewPage(cspSource: string, style: string, body: string, script: string): string {
  const nonce = Math.random().toString(36).slice(2);
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
  content="default-src 'none'; style-src ${cspSource} 'unsafe-inline'; script-src 'nonce-${nonce}';">
<style>
  body { font-family: var(--vscode-font-family); color: var(--vscode-foreground); padding: 0 1em; }
${style}
</style></head>
<body>
${body}
<script nonce="${nonce}">
${script}
</script></body></html>`;
}
