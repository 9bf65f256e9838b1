import { ILabShell, ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker } from '@jupyterlab/notebook';

import { SlicesPanel } from './panel';

/** The "TPU slices" left sidebar: every slice the server's registry knows, whichever kernel owns it. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'tpunb:sidebar',
  description: 'TPU slices in the left sidebar: hosts, cost, launch and delete.',
  autoStart: true,
  requires: [ILabShell, INotebookTracker],
  optional: [ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    tracker: INotebookTracker,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new SlicesPanel(tracker, shell);
    shell.add(panel, 'left', { rank: 300 });
    restorer?.add(panel, panel.id);
  }
};

export default plugin;
