// Runs the quickstart notebook in a real JupyterLab page (Debian chromium, headless) and reports
// what the mfs_nb widgets rendered. Usage: node browser.mjs LAB_URL TOKEN NOTEBOOK SHOT_DIR
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const [url, token, notebook, shots] = process.argv.slice(2);
mkdirSync(shots, { recursive: true });
const result = { dialogs: [], errors: [] };
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.on("dialog", async (d) => { result.dialogs.push(d.message()); await d.dismiss(); });
  page.on("pageerror", (e) => result.errors.push(String(e)));
  await page.goto(`${url}/lab/tree/${notebook}?token=${token}`, { waitUntil: "domcontentloaded", timeout: 120000 });
  await page.waitForSelector(".jp-Notebook .jp-Cell", { timeout: 120000 });
  // the kernel must be up before "Run All Cells" is worth clicking
  await page.waitForFunction(() => /Idle/.test(document.body.innerText), null, { timeout: 120000 });
  await page.waitForTimeout(1000);
  await page.locator(".lm-MenuBar-itemLabel", { hasText: /^Run$/ }).click();
  await page.locator(".lm-Menu-itemLabel", { hasText: /^Run All Cells$/ }).click();
  for (const sel of [".mfs-status", ".mfs-recall", ".mfs-context", ".mfs-ledger"]) {
    await page.waitForSelector(sel, { timeout: 180000, state: "attached" });
  }
  await page.waitForFunction(() => document.querySelectorAll(".mfs-ledger table").length > 0, null, { timeout: 60000 });
  result.meter = await page.locator(".mfs-status .mfs-line").first().textContent();
  result.meterFill = await page.locator(".mfs-status .mfs-meter-fill").first().getAttribute("style");
  result.recall = await page.locator(".mfs-recall").first().innerText();
  result.layers = await page.locator(".mfs-context details.mfs-layer > summary").allInnerTexts();
  result.bar = await page.locator(".mfs-context .mfs-bar-part").count();
  // open the first segment layer and read its exact text
  const seg = page.locator(".mfs-context details.mfs-layer", { hasText: "L0 segment" }).first();
  await seg.locator("summary").click();
  result.segmentOpen = await seg.evaluate((d) => d.open);
  result.segmentText = await seg.locator("pre").innerText();
  result.rawText = await page.locator(".mfs-context details.mfs-layer", { hasText: "raw tail" }).first().locator("pre").textContent();
  result.injected = await page.evaluate(() => document.querySelectorAll(".jp-OutputArea script, .jp-OutputArea img[onerror]").length);
  result.ledgerRows = await page.locator(".mfs-ledger table tr").count();
  result.ledgerText = await page.locator(".mfs-ledger").first().innerText();
  const shot = async (sel, name) => {
    const el = page.locator(sel).first();
    await el.scrollIntoViewIfNeeded();
    await el.screenshot({ path: `${shots}/${name}.png` });
  };
  await shot(".mfs-status", "status");
  await shot(".mfs-context", "context");
  await shot(".mfs-recall", "recall");
  await shot(".mfs-ledger", "ledger");
  // the tool-trajectory tab
  await page.locator(".mfs-context .mfs-tab", { hasText: "tool trajectory" }).first().click();
  result.toolsTab = await page.locator(".mfs-context").first().innerText();
} catch (e) {
  result.errors.push(String(e && e.stack || e));
  try { await browser.contexts()[0].pages()[0].screenshot({ path: `${process.env.MFS_FAILSHOT || "/tmp"}/failure.png`, fullPage: true }); } catch {}
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
