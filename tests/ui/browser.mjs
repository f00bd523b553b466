// Runs the quickstart notebook in a real JupyterLab page (Debian chromium, headless), reports what
// the mfs_nb outputs rendered, then saves, stops the kernel, reloads and reports them again. Usage: node browser.mjs LAB_URL TOKEN NOTEBOOK SHOT_DIR
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
  // JupyterLab asks once whether to fetch news; answer so the toast does not cover the outputs
  await page.getByRole("button", { name: "No", exact: true }).click({ timeout: 5000 }).catch(() => {});
  await page.locator(".lm-MenuBar-itemLabel", { hasText: /^Run$/ }).click();
  await page.locator(".lm-Menu-itemLabel", { hasText: /^Run All Cells$/ }).click();
  for (const sel of [".mfs-status", ".mfs-recall", ".mfs-preview", ".mfs-context", ".mfs-ledger"]) {
    await page.waitForSelector(sel, { timeout: 180000, state: "attached" });
  }
  await page.waitForFunction(() => document.querySelectorAll(".mfs-ledger table").length > 0, null, { timeout: 60000 });
  // the bill is the cell after the ledger: bring it in view and wait for it
  await page.locator(".mfs-ledger").first().scrollIntoViewIfNeeded().catch(() => {});
  await page.waitForFunction(() => /with no cache/.test(document.body.innerText), null, { timeout: 60000 });
  const read = async () => {
    const r = {};
    // JupyterLab renders only the cells near the viewport: bring each output in view before reading it
    const show = async (sel) => page.locator(sel).first().scrollIntoViewIfNeeded().catch(() => {});
    await show(".mfs-status");
    r.meter = await page.locator(".mfs-status .mfs-line").first().textContent();
    r.meterFill = await page.locator(".mfs-status .mfs-meter-fill").first().getAttribute("style");
    await show(".mfs-recall");
    r.recall = await page.locator(".mfs-recall").first().innerText();
    await show(".mfs-context");
    r.layers = await page.locator(".mfs-context details.mfs-layer > summary").allInnerTexts();
    r.bar = await page.locator(".mfs-context .mfs-bar-part").count();
    r.contextText = await page.locator(".mfs-context").first().innerText();
    await show(".mfs-ledger");
    r.ledgerRows = await page.locator(".mfs-ledger table tr").count();
    r.ledgerText = await page.locator(".mfs-ledger").first().innerText();
    const cost = page.locator(".jp-OutputArea-output", { hasText: "priced with litellm" }).first();
    await cost.scrollIntoViewIfNeeded({ timeout: 10000 }).catch(() => {});
    r.cost = await cost.textContent({ timeout: 10000 }).catch(() => "");
    r.mfsOutputs = await page.locator(".mfs-status, .mfs-recall, .mfs-preview, .mfs-context, .mfs-ledger").count();
    await show(".mfs-preview");
    r.preview = await page.locator(".mfs-preview").first().innerText();
    r.pinned = await page.locator(".jp-OutputArea-output", { hasText: "knowledge slot: pinned" }).first().textContent();
    r.widgetErrors = await page.evaluate(() => (document.body.innerText.match(/Error displaying widget/g) || []).length);
    r.ledgerFits = await page.locator(".mfs-ledger").first().evaluate((el) => el.scrollWidth <= el.clientWidth + 1);
    return r;
  };
  Object.assign(result, await read());
  // open the first segment layer and read its exact text
  const seg = page.locator(".mfs-context details.mfs-layer", { hasText: /^\s*summary · uids/ }).first();
  await seg.locator("summary").click();
  result.segmentOpen = await seg.evaluate((d) => d.open);
  result.segmentText = await seg.locator("pre").innerText();
  const slot = page.locator(".mfs-context details.mfs-layer", { hasText: "knowledge slot" }).first();
  await slot.locator("summary").click();
  result.slotText = await slot.locator("pre").innerText();
  result.rawText = await page.locator(".mfs-context details.mfs-layer", { hasText: "raw tail" }).first().locator("pre").textContent();
  result.injected = await page.evaluate(() => document.querySelectorAll(".jp-OutputArea script, .jp-OutputArea img[onerror]").length);
  const shot = async (sel, name) => {
    const el = page.locator(sel).first();
    await el.scrollIntoViewIfNeeded();
    await el.screenshot({ path: `${shots}/${name}.png` });
  };
  await shot(".mfs-status", "status");
  await shot(".mfs-context", "context");
  await shot(".mfs-recall", "recall");
  await shot(".mfs-preview", "preview");
  await shot(".mfs-ledger", "ledger");
  // save, stop the kernel, reload: what a person sees reopening the notebook later
  await page.locator(".jp-Notebook").first().click();
  await page.keyboard.press("Control+s");
  // wait for JupyterLab to say the save is done; reading the file while the server writes it would
  // race its atomic write (the server then restores the previous file as "….invalid")
  await page.waitForFunction(() => /Saving completed/.test(document.body.innerText)
    && !document.querySelector(".lm-TabBar-tab.jp-mod-dirty"), null, { timeout: 60000 });
  await page.waitForTimeout(1500);
  const saved = await page.evaluate(async ([u, t, n]) => {
    const nb = await (await fetch(`${u}/api/contents/${n}?token=${t}`)).json();
    return JSON.stringify(nb.content).includes("mfs-ledger");
  }, [url, token, notebook]);
  if (!saved) throw new Error("the saved notebook has no mfs outputs");
  await page.evaluate(async ([u, t]) => {
    const sessions = await (await fetch(`${u}/api/sessions?token=${t}`)).json();
    for (const s of sessions) await fetch(`${u}/api/sessions/${s.id}?token=${t}`, { method: "DELETE" });
  }, [url, token]);
  await page.reload({ waitUntil: "domcontentloaded", timeout: 120000 });
  await page.waitForSelector(".jp-Notebook .jp-Cell", { timeout: 120000 });
  await page.waitForSelector(".mfs-ledger table", { timeout: 120000, state: "attached" });
  await page.waitForTimeout(3000); // a widget view would have failed by now ("model not found")
  result.reopened = await read();
} catch (e) {
  result.errors.push(String(e && e.stack || e));
  try { await browser.contexts()[0].pages()[0].screenshot({ path: `${process.env.MFS_FAILSHOT || "/tmp"}/failure.png`, fullPage: true }); } catch {}
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
