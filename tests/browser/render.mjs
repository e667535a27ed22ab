// Opens `dvc plots show`'s HTML in headless Chromium and reports what rendered.
//
//   node tests/browser/render.mjs dvc_plots/index.html screenshot.png
//
// DVC's page loads vega, vega-lite and vega-embed from cdn.jsdelivr.net; with no internet
// here, those requests are answered from node_modules (the same versions, pinned in
// package.json), so the page itself is DVC's, unmodified. Prints JSON: how many plots the page
// declares, how many rendered an SVG or canvas, how much of each canvas is drawn on, and any
// page errors.
import { chromium } from "playwright-core";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const CDN = {
  "https://cdn.jsdelivr.net/npm/vega@5.20.2": "vega/build/vega.min.js",
  "https://cdn.jsdelivr.net/npm/vega-lite@5.2.0": "vega-lite/build/vega-lite.min.js",
  "https://cdn.jsdelivr.net/npm/vega-embed@6.18.2": "vega-embed/build/vega-embed.min.js",
};
const [html, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
});
const page = await browser.newPage({ viewport: { width: 1280, height: 1600 } });
const errors = [];
page.on("pageerror", (e) => errors.push(String(e)));
await page.route("**/*", (route) => {
  const url = route.request().url();
  if (url in CDN) return route.fulfill({ path: path.join(here, "node_modules", CDN[url]), contentType: "text/javascript" });
  if (url.startsWith("file://")) return route.continue();
  return route.abort();  // nothing else may leave the machine
});
await page.goto("file://" + path.resolve(html));
const declared = await page.locator("div[id]").evaluateAll((divs) => divs.filter((d) => d.closest("body")).length);
await page.waitForFunction(() => document.querySelectorAll(".vega-embed canvas, .vega-embed svg.marks").length > 0, null, { timeout: 20000 })
  .catch(() => {});
const rendered = await page.locator(".vega-embed canvas, .vega-embed svg.marks").count();
// Vega draws on a canvas: report, per plot, the fraction of its pixels that are not blank.
const inked = await page.locator(".vega-embed canvas").evaluateAll((canvases) => canvases.map((c) => {
  const { data } = c.getContext("2d").getImageData(0, 0, c.width, c.height);
  let ink = 0;
  for (let i = 0; i < data.length; i += 4) if (data[i + 3] > 0 && (data[i] < 240 || data[i + 1] < 240 || data[i + 2] < 240)) ink++;
  return ink / (c.width * c.height);
}));
await page.screenshot({ path: screenshot, fullPage: true });
await browser.close();
console.log(JSON.stringify({ declared, rendered, inked, errors }));
