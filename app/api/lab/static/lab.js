// The lab's entry point: pick the page from the URL; every page has its own shareable address.
import { guard, page, h } from "./ui.js";
import { homePage } from "./home.js";
import { datasetPage, uploadPage } from "./dataset.js";
import { probePage } from "./probe.js";
import { headPage } from "./head.js";
import { regimesPage } from "./regimes.js";
import { comparePage } from "./compare.js";

const routes = [
  [/^\/$|^\/lab\/?$/, () => homePage()],
  [/^\/lab\/datasets\/new$/, () => uploadPage()],
  [/^\/lab\/datasets\/([^/]+)$/, (id) => datasetPage(id)],
  [/^\/lab\/probes\/([^/]+)$/, (id) => probePage(id)],
  [/^\/lab\/heads\/([^/]+)$/, (id) => headPage(id)],
  [/^\/lab\/regimes\/([^/]+)$/, (id) => regimesPage(id)],
  [/^\/lab\/compare\/?$/, () => comparePage(new URLSearchParams(location.search))],
];

const path = location.pathname;
const hit = routes.find(([re]) => re.test(path));
if (hit) {
  const m = path.match(hit[0]);
  guard(() => hit[1](...m.slice(1).map(decodeURIComponent)));
} else {
  page("Not found", h("p", {}, "No lab page here. ", h("a", { href: "/" }, "Home")));
}
